#include "comm/mpi/route_choice.hpp"

#include <gpucloud/runtime/error.hpp>

#include <algorithm>
#include <cstdlib>
#include <cstring>

namespace gpucloud::detail {

RoutePolicy route_policy_from_environment() {
  const char* text = std::getenv("GPUCLOUD_COLLECTIVE_ROUTE");
  if (text == nullptr || *text == '\0' || std::strcmp(text, "auto") == 0) return RoutePolicy::automatic;
  if (std::strcmp(text, "fastest") == 0) return RoutePolicy::fastest;
  if (std::strcmp(text, "schedule") == 0) return RoutePolicy::schedule;
  if (std::strcmp(text, "mpi") == 0) return RoutePolicy::mpi;
  GPUCLOUD_FAIL(InvalidArgument, "Communicator",
                std::string("GPUCLOUD_COLLECTIVE_ROUTE: '") + text + "' is not one of auto, fastest, schedule, mpi");
}

bool routed(RoutePolicy policy, Collective kind, int ranks, Route other) {
  if (other == Route::schedule) return false;  // one route
  const bool reduces = kind == Collective::all_reduce || kind == Collective::reduce_scatter;
  return !(policy == RoutePolicy::automatic && reduces && ranks > 2 && other == Route::mpi);
}

void RouteChooser::Timings::add(double s) {
  if (cold) {
    cold = false;
    return;
  }
  seconds[static_cast<std::size_t>(next)] = s;
  next = (next + 1) % kWindow;
  count = std::min(count + 1, kWindow);
}

double RouteChooser::Timings::mean() const {
  double sum = 0;
  for (int i = 0; i < count; ++i) sum += seconds[static_cast<std::size_t>(i)];
  return sum / count;
}

std::int64_t RouteChooser::key(Collective kind, std::size_t bytes, Route other) {
  std::int64_t log2 = 0;
  while (log2 < 63 && (std::size_t{1} << log2) < bytes) ++log2;  // the class: the power of two at or above
  return (static_cast<std::int64_t>(kind) * 4 + static_cast<std::int64_t>(other)) * 64 + log2;
}

Route RouteChooser::pick(Collective kind, std::size_t bytes, Route other) {
  Class& c = classes_[key(kind, bytes, other)];
  const Timings &sched = c.timings[0], &alt = c.timings[1];
  if (!c.chosen || sched.count < kWarmUp || alt.count < kWarmUp) {  // the one called fewer times, its first call too
    return sched.count + (sched.cold ? 0 : 1) <= alt.count + (alt.cold ? 0 : 1) ? Route::schedule : other;
  }
  ++c.since_change;
  if (++c.since_probe >= c.probe_every) {
    c.since_probe = 0;
    return *c.chosen == Route::schedule ? other : Route::schedule;
  }
  return *c.chosen;
}

void RouteChooser::record(Collective kind, std::size_t bytes, Route route, double seconds, Route other) {
  Class& c = classes_[key(kind, bytes, other)];
  c.timings[route == Route::schedule ? 0 : 1].add(seconds);
  if (c.timings[0].count < kWarmUp || c.timings[1].count < kWarmUp) return;
  const double sched = c.timings[0].mean(), alt = c.timings[1].mean();
  const Route best = sched <= alt ? Route::schedule : other;
  const double best_mean = std::min(sched, alt);
  if (c.chosen != best) {  // the first choice, or the other route won
    c.chosen = best;
    c.chosen_mean = best_mean;
    c.probe_every = kFirstProbe;
    c.since_probe = 0;
    c.since_change = 0;
  } else if (route != best) {  // a probe of the other route, still slower
    c.probe_every = std::min(c.probe_every * 2, kLastProbe);
  } else if ((best_mean > 2 * c.chosen_mean || 2 * best_mean < c.chosen_mean) && c.since_change >= kRemeasureEvery) {
    // Conditions changed: the other route is measured afresh (its first call timed again).
    Timings& slower = c.timings[best == Route::schedule ? 1 : 0];
    slower = Timings{};
    slower.cold = false;
    c.chosen_mean = best_mean;
    c.probe_every = kFirstProbe;
    c.since_change = 0;
  }
}

std::optional<Route> RouteChooser::chosen(Collective kind, std::size_t bytes, Route other) const {
  const auto it = classes_.find(key(kind, bytes, other));
  if (it == classes_.end()) return std::nullopt;
  return it->second.chosen;
}

}  // namespace gpucloud::detail
