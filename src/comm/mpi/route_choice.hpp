// Internal: which route a mid-size or large collective of the MPI backend takes, chosen by
// measurement (not API). Two routes do the same collective: the library's polled schedule (ring,
// halving and doubling, chain or tree: ring.hpp) and either MPI's own nonblocking collective
// (MPI_Iallreduce, MPI_Ireduce_scatter_block, MPI_Iallgather, MPI_Ibcast), polled the same way,
// or (an all-reduce or reduce-scatter on 3-16 ranks of one node up to 16 MiB) direct messages
// posted at once with the ring's bits (ring.hpp's DirectAllReduce).
// Which is faster depends on what the machine gives MPI (a single-copy mechanism or not) and on
// how busy its cores are, both of which change at run time, so rank 0 times both and tells every
// rank which to take through the agreement that precedes each collective.
#pragma once

#include "comm/agreement.hpp"

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>

namespace gpucloud::detail {

/// The ways a routed collective runs (their values travel in the agreement): the library's polled
/// schedule, MPI's nonblocking collective, or (an all-reduce or reduce-scatter on 3-16 ranks of
/// one node up to 16 MiB: ring.hpp's direct_applies) direct messages posted at once, with the
/// ring's bits. A collective has two: the schedule and one other, the same for every call of its size.
enum class Route : std::int64_t { schedule = 0, mpi = 1, direct = 2 };

/// How routes are picked (GPUCLOUD_COLLECTIVE_ROUTE): `auto` (the default) measures where both
/// routes give the same bits (data movement; reductions on 2 ranks, where a + b == b + a; the
/// direct all-reduce or reduce-scatter against the ring) and keeps the schedule for reductions over more ranks whose
/// other route is MPI's, which adds in a different order, so a rerun or a resumed job reproduces
/// its sums bit for bit; `fastest` measures everywhere; `schedule` and `mpi` force one route
/// (`mpi`: MPI's nonblocking collective, also where the other route is the direct one).
enum class RoutePolicy { automatic, fastest, schedule, mpi };

/// The policy GPUCLOUD_COLLECTIVE_ROUTE names (unset or empty: automatic). Throws
/// InvalidArgument naming the variable for any other value.
RoutePolicy route_policy_from_environment();

/// Whether a collective of @p kind over @p ranks ranks whose other route is @p other takes a
/// measured (or forced) route under @p policy; every rank decides the same. Route::schedule as
/// @p other: it has one route under every policy (the collectives whose data goes with the
/// agreement: MpiCommunicator::sends_with_agreement).
bool routed(RoutePolicy policy, Collective kind, int ranks, Route other = Route::mpi);

/// Rank 0's choice between the routes, per collective, other route and size class (powers of two). Each route's
/// first call of a class is not timed (first touches, MPI's schedule set-up); while either route
/// has fewer than kWarmUp timings the two alternate; then the one with the lower mean of its last
/// kWindow timings runs (the mean: beside busy cores a call meets a scheduler tick or not, and a
/// job pays the mean), and the other is timed again once every probe interval: 64 calls, doubled
/// (up to 4096) each time it is still slower, back to 64 when it wins. When the chosen route's
/// mean has moved by more than 2x either way since it was chosen (a competitor for the cores came
/// or went), the other's timings are dropped and measured afresh, at most once every 64 calls.
class RouteChooser {
 public:
  static constexpr int kWarmUp = 3;
  static constexpr int kWindow = 8;
  static constexpr std::uint32_t kFirstProbe = 64, kLastProbe = 4096, kRemeasureEvery = 64;

  /// The route the next @p kind collective of @p bytes takes: the schedule or @p other.
  Route pick(Collective kind, std::size_t bytes, Route other = Route::mpi);
  /// One timing: a @p kind collective of @p bytes whose other route is @p other took @p seconds on @p route.
  void record(Collective kind, std::size_t bytes, Route route, double seconds, Route other = Route::mpi);
  /// The route chosen for the class of @p bytes (other route @p other), once both are measured.
  std::optional<Route> chosen(Collective kind, std::size_t bytes, Route other = Route::mpi) const;

 private:
  struct Timings {
    std::array<double, kWindow> seconds{};
    int count = 0, next = 0;
    bool cold = true;  // the first call not yet seen
    void add(double s);
    double mean() const;
  };
  struct Class {
    std::array<Timings, 2> timings;  // the schedule's, the other route's
    std::optional<Route> chosen;
    double chosen_mean = 0;  // the chosen route's mean when it was chosen or last re-measured against
    std::uint32_t since_probe = 0, probe_every = kFirstProbe, since_change = 0;
  };
  static std::int64_t key(Collective kind, std::size_t bytes, Route other);
  std::unordered_map<std::int64_t, Class> classes_;
};

}  // namespace gpucloud::detail
