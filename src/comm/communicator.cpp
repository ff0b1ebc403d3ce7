// Communicator's backend-independent layer: accessors, the timeout, the cost model and the
// automatic flat/hierarchical choice; every operation forwards to the backend (MPI or NCCL).
#include <gpucloud/comm/communicator.hpp>
#include <gpucloud/movement/copy.hpp>
#include <gpucloud/runtime/error.hpp>

#include "comm/auto_form.hpp"
#include "comm/communicator_impl.hpp"
#include "comm/cost_model_fit.hpp"
#include "memory/access.hpp"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <optional>
#include <vector>

namespace gpucloud {

namespace detail {

std::chrono::milliseconds timeout_from_environment() {
  const char* t = std::getenv("GPUCLOUD_COMM_TIMEOUT");
  if (t == nullptr || *t == '\0') return std::chrono::milliseconds(600000);
  char* end = nullptr;
  const double seconds = std::strtod(t, &end);
  // 1 ms to ~31 years: a value outside would round to 0 ms or overflow the millisecond count.
  GPUCLOUD_EXPECTS(end != t && *end == '\0' && std::isfinite(seconds) && seconds >= 0.001 && seconds <= 1e9,
                   "Communicator",
                   std::string("GPUCLOUD_COMM_TIMEOUT: '") + t + "' is not a number of seconds in [0.001, 1e9]");
  return std::chrono::milliseconds(static_cast<std::int64_t>(std::llround(seconds * 1000.0)));
}

int local_size_from_environment(const char* text, int world_size, const char* call) {
  char* end = nullptr;
  const long v = std::strtol(text, &end, 10);
  GPUCLOUD_EXPECTS(end != text && *end == '\0' && v >= 1 && v <= world_size && world_size % v == 0, call,
                   std::string("GPUCLOUD_LOCAL_SIZE: '") + text + "' does not divide the job's " +
                       std::to_string(world_size) + " processes into equal nodes");
  return static_cast<int>(v);
}

namespace {
std::mutex& broken_mutex() {
  static auto* m = new std::mutex();
  return *m;
}
std::string& broken_reason() {  // guarded by broken_mutex(); never destroyed (read at exit)
  static auto* why = new std::string();
  return *why;
}
}  // namespace

void note_broken_communicator(const std::string& why) {
  std::lock_guard<std::mutex> lock(broken_mutex());
  if (broken_reason().empty()) broken_reason() = why;
}

void end_job_if_communicator_broke() noexcept {
  std::string why;
  {
    std::lock_guard<std::mutex> lock(broken_mutex());
    why = broken_reason();
  }
  if (why.empty()) return;
  std::fprintf(stderr,
               "gpucloud: ending the job: %s; MPI cannot finalise without the ranks that did not come "
               "(it would wait for them)\n",
               why.c_str());
  std::fflush(stderr);
  abort_job(1);
}

std::string where(int rank) {
  char name[256] = {};
  gethostname(name, sizeof name - 1);
  return std::string(name) + ":rank " + std::to_string(rank);
}

}  // namespace detail

std::exception_ptr Communicator::Impl::timed_out(const char* op, std::chrono::steady_clock::time_point began,
                                                 const char* ends) {
  const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - began);
  broken = true;
  detail::note_broken_communicator(where + ": " + op + " timed out after " + std::to_string(waited.count()) + " ms");
  return std::make_exception_ptr(CommunicationError(
      op,
      where + " waited " + std::to_string(waited.count()) +
          " ms for the other ranks to finish the collective (GPUCLOUD_COMM_TIMEOUT): a rank is missing, stopped or "
          "dead, or the transfer needs longer than the timeout (then raise it: GPUCLOUD_COMM_TIMEOUT or "
          "set_timeout). The communicator is broken: later collectives on it fail, and " +
          ends,
      __FILE__, __LINE__));
}

void Communicator::Impl::check_usable(const char* op) const {
  if (broken) {
    throw CommunicationError(op, where + ": the communicator is broken by an earlier timeout or failure", __FILE__,
                             __LINE__);
  }
}

Communicator::Communicator(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}
Communicator::~Communicator() = default;
Communicator::Communicator(Communicator&&) noexcept = default;
Communicator& Communicator::operator=(Communicator&&) noexcept = default;

CommBackend Communicator::backend() const noexcept { return impl_->backend; }
Device Communicator::device() const noexcept { return impl_->device; }
int Communicator::rank() const noexcept { return impl_->rank; }
int Communicator::size() const noexcept { return impl_->size; }
int Communicator::local_rank() const noexcept { return impl_->local_rank; }
int Communicator::local_size() const noexcept { return impl_->local_size; }
int Communicator::node() const noexcept { return impl_->node; }
int Communicator::nodes() const noexcept { return impl_->nodes; }
Hierarchy Communicator::hierarchy() const { return impl_->grouping; }
std::chrono::milliseconds Communicator::timeout() const noexcept { return impl_->timeout; }
bool Communicator::broken() const noexcept { return impl_->broken; }
double Communicator::busy_seconds() const noexcept { return static_cast<double>(impl_->busy_ns.load()) * 1e-9; }

void Communicator::set_timeout(std::chrono::milliseconds timeout) {
  GPUCLOUD_EXPECTS(timeout.count() > 0, "Communicator::set_timeout", "timeout: must be positive");
  impl_->timeout = timeout;
}

namespace {
// In place (the same memory) or apart: a partial overlap would read values already overwritten.
void check_in_place_or_apart(BufferView send, BufferView recv, const char* call) {
  GPUCLOUD_EXPECTS(send.data() == recv.data() || !detail::overlaps(send, recv), call,
                   "recv: partly overlaps send; pass the same memory (in place) or separate memory");
}
}  // namespace

void Communicator::all_reduce(BufferView send, BufferView recv, ReduceOp op, StreamView stream) {
  constexpr const char* call = "Communicator::all_reduce";
  impl_->check_usable(call);
  check_in_place_or_apart(send, recv, call);
  impl_->all_reduce(send, recv, op, stream);
}

void Communicator::hierarchical_all_reduce(BufferView send, BufferView recv, ReduceOp op, StreamView stream) {
  constexpr const char* call = "Communicator::hierarchical_all_reduce";
  impl_->check_usable(call);
  GPUCLOUD_EXPECTS(impl_->uniform_groups, call,
                   impl_->grouping.level == "node" ? "nodes have different numbers of processes"
                                                   : "groups have different numbers of processes");
  check_in_place_or_apart(send, recv, call);
  impl_->hierarchical_all_reduce(send, recv, op, stream);
}

void Communicator::reduce_scatter(BufferView send, BufferView recv, ReduceOp op, StreamView stream) {
  constexpr const char* call = "Communicator::reduce_scatter";
  impl_->check_usable(call);
  GPUCLOUD_EXPECTS(send.dtype() == recv.dtype(), call, "recv: must match send's dtype");
  GPUCLOUD_EXPECTS(send.size() == recv.size() * static_cast<std::size_t>(impl_->size), call,
                   "send: " + std::to_string(send.size()) + " elements, expected size() * recv = " +
                       std::to_string(recv.size() * static_cast<std::size_t>(impl_->size)));
  impl_->reduce_scatter(send, recv, op, stream);
}

void Communicator::all_gather(BufferView send, BufferView recv, StreamView stream) {
  constexpr const char* call = "Communicator::all_gather";
  impl_->check_usable(call);
  GPUCLOUD_EXPECTS(send.dtype() == recv.dtype(), call, "recv: must match send's dtype");
  GPUCLOUD_EXPECTS(recv.size() == send.size() * static_cast<std::size_t>(impl_->size), call,
                   "recv: " + std::to_string(recv.size()) + " elements, expected size() * send = " +
                       std::to_string(send.size() * static_cast<std::size_t>(impl_->size)));
  impl_->all_gather(send, recv, stream);
}

void Communicator::broadcast(BufferView buffer, int root, StreamView stream) {
  constexpr const char* call = "Communicator::broadcast";
  impl_->check_usable(call);
  GPUCLOUD_EXPECTS(root >= 0 && root < impl_->size, call,
                   "root: " + std::to_string(root) + " is not a rank of " + std::to_string(impl_->size));
  impl_->broadcast(buffer, root, stream);
}

void Communicator::barrier(StreamView stream) {
  impl_->check_usable("Communicator::barrier");
  impl_->barrier(stream);
}

AllReduceCostModel Communicator::measure_cost_model(StreamView stream) {
  impl_->check_usable("Communicator::measure_cost_model");
  stream.synchronize();  // ordered after the collectives enqueued before
  Impl& c = *impl_;
  std::lock_guard<std::mutex> lock(c.order);
  // Fit T(S) = 2(p-1) alpha + 2(p-1)/p S beta from a tiny and a large all-reduce.
  auto fit = [&](bool intra, int p) {
    LinkCost link;
    const double small = c.time_all_reduce(intra, 8, 20);
    const std::size_t big_bytes = std::size_t{4} << 20;
    const double big = c.time_all_reduce(intra, big_bytes, 3);
    if (p <= 1) return link;
    link.alpha = small / (2.0 * (p - 1));
    link.beta = std::max(big - small, 0.0) / (2.0 * (p - 1) / p * static_cast<double>(big_bytes));
    return link;
  };
  AllReduceCostModel m;
  // The hierarchy's groups: a node, or a node's NVLink island / NUMA node (GPUCLOUD_HIERARCHY).
  m.local_size = c.grouping.group_size;
  m.nodes = c.grouping.groups;
  m.flat_halving = c.flat_all_reduce_halves();
  std::vector<LinkCost> intra, inter;
  for (int i = 0; i < detail::kCostModelFits; ++i) {  // interleaved: a busy moment hits one fit of each
    intra.push_back(fit(true, c.grouping.group_size));
    if (c.grouping.groups > 1) inter.push_back(fit(false, c.grouping.groups));
  }
  detail::set_links(m, intra, inter);
  c.model = m;
  c.forget_auto_trials();
  return m;
}

void Communicator::set_cost_model(const AllReduceCostModel& model) {
  const Hierarchy& g = impl_->grouping;
  GPUCLOUD_EXPECTS(model.local_size == g.group_size && model.nodes == g.groups, "Communicator::set_cost_model",
                   "model: measured for " + std::to_string(model.nodes) + " group(s) of " +
                       std::to_string(model.local_size) + ", this job has " + std::to_string(g.groups) + " of " +
                       std::to_string(g.group_size) + " (groups: " + g.level + ")");
  impl_->model = model;
  impl_->forget_auto_trials();
}

namespace {
// all_reduce_auto()'s form for @p bytes without measuring: flat where it has no choice (no model,
// one group, groups of one, unequal groups), else the model's pick; nullopt where the model ties.
std::optional<AllReduceForm> predicted_form(const Communicator::Impl& c, std::size_t bytes) {
  if (!c.model || c.grouping.groups <= 1 || c.grouping.group_size <= 1 || !c.uniform_groups) {
    return AllReduceForm::flat;
  }
  if (c.model->ties(bytes)) return std::nullopt;
  return c.model->prefer_hierarchical(bytes) ? AllReduceForm::hierarchical : AllReduceForm::flat;
}
}  // namespace

void Communicator::all_reduce_auto(BufferView send, BufferView recv, ReduceOp op, StreamView stream) {
  Impl& c = *impl_;
  const std::size_t bytes = send.size_bytes();
  auto run = [&](bool hierarchical) {
    if (hierarchical) {
      hierarchical_all_reduce(send, recv, op, stream);
    } else {
      all_reduce(send, recv, op, stream);
    }
  };
  if (const auto form = predicted_form(c, bytes)) return run(*form == AllReduceForm::hierarchical);
  // The predictions tie: the class's first calls alternate the forms, each timed from an idle
  // stream to its end; the last of them combines every rank's times, so all decide alike.
  bool measuring = false, hierarchical = false;
  {
    std::lock_guard<std::mutex> lock(c.auto_lock);
    const detail::AutoFormTrials& t = c.auto_trials[detail::auto_size_class(bytes)];
    measuring = t.form() == AllReduceForm::measuring;
    hierarchical = t.next() == AllReduceForm::hierarchical;
  }
  if (!measuring) return run(hierarchical);
  stream.synchronize();
  const auto t0 = std::chrono::steady_clock::now();
  run(hierarchical);
  stream.synchronize();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  detail::AutoFormTrials::Seconds times{};
  {
    std::lock_guard<std::mutex> lock(c.auto_lock);
    detail::AutoFormTrials& t = c.auto_trials[detail::auto_size_class(bytes)];
    if (!t.record(seconds)) return;
    times = t.seconds();
  }
  // The slowest rank's time of each call, on every rank (a buffer where the backend's memory is).
  Buffer host_times(times.size(), DType::float64);
  std::copy(times.begin(), times.end(), static_cast<double*>(host_times.data()));
  if (c.device.is_host()) {
    all_reduce(host_times, host_times, ReduceOp::max, stream);
  } else {
    Buffer device_times(times.size(), DType::float64, c.device);
    copy(device_times, host_times, stream);
    all_reduce(device_times, device_times, ReduceOp::max, stream);
    copy(host_times, device_times, stream);
  }
  stream.synchronize();
  std::copy_n(static_cast<const double*>(host_times.data()), times.size(), times.begin());
  std::lock_guard<std::mutex> lock(c.auto_lock);
  c.auto_trials[detail::auto_size_class(bytes)].decide(times);
}

AllReduceForm Communicator::all_reduce_auto_form(std::size_t bytes) const {
  const Impl& c = *impl_;
  if (const auto form = predicted_form(c, bytes)) return *form;
  std::lock_guard<std::mutex> lock(c.auto_lock);
  const auto found = c.auto_trials.find(detail::auto_size_class(bytes));
  return found == c.auto_trials.end() ? AllReduceForm::measuring : found->second.form();
}

}  // namespace gpucloud
