#include "comm/nccl/nccl_comms.hpp"

#include <gpucloud/runtime/error.hpp>

#include "comm/nccl/nccl_check.hpp"
#include "comm/nccl/nccl_wait.hpp"

#include <cstdio>
#include <utility>

namespace gpucloud::detail {

ncclConfig_t non_blocking_config() {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  return config;
}

namespace {

std::string nccl_reason(ncclResult_t result, ncclComm_t comm) {
  std::string reason = ncclGetErrorString(result);
  if (const char* last = ncclGetLastError(comm); last != nullptr && *last != '\0') reason += ": " + std::string(last);
  return reason;
}

}  // namespace

NcclComms::NcclComms(std::string where, const std::atomic<std::chrono::milliseconds>& timeout)
    : where_(std::move(where)), timeout_(timeout) {}

NcclComms::~NcclComms() {
  on_failure_ = nullptr;  // the owner is going away: a failure here only aborts
  std::unique_lock<std::mutex> lock(mutex_);
  if (aborted_ || all_ == nullptr) return;
  const std::vector<ncclComm_t> comms = distinct();
  bool clean = true;
  for (ncclComm_t c : comms) {
    const ncclResult_t r = ncclCommFinalize(c);
    clean = clean && (r == ncclSuccess || r == ncclInProgress);
  }
  lock.unlock();
  for (ncclComm_t c : comms) {
    if (!clean) break;
    const Settle s = wait_to_settle([&] { return state_of(c); }, ncclInProgress, timeout_.load(), [] { return false; });
    clean = s.outcome == SettleOutcome::settled && s.state == ncclSuccess;
    if (!clean) {
      std::fprintf(stderr, "gpucloud: %s: ncclCommFinalize %s after %lld ms; aborting the communicator\n",
                   where_.c_str(),
                   s.outcome == SettleOutcome::timed_out
                       ? "did not finish (GPUCLOUD_COMM_TIMEOUT)"
                       : ("failed: " + std::string(ncclGetErrorString(static_cast<ncclResult_t>(s.state)))).c_str(),
                   static_cast<long long>(s.waited.count()));
    }
  }
  lock.lock();
  if (clean) {
    for (ncclComm_t c : comms) ncclCommDestroy(c);  // local resources only: finalize settled
  } else {
    abort_locked();
  }
}

std::vector<ncclComm_t> NcclComms::distinct() const {
  std::vector<ncclComm_t> out;
  for (ncclComm_t c : {cross_, local_, all_}) {  // sub-communicators first, the parent last
    if (c == nullptr) continue;
    bool seen = false;
    for (ncclComm_t o : out) seen = seen || o == c;
    if (!seen) out.push_back(c);
  }
  return out;
}

void NcclComms::init_rank(const ncclUniqueId& id, int rank, int size, const char* call) {
  ncclConfig_t config = non_blocking_config();
  ncclResult_t result;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    result = ncclCommInitRankConfig(&all_, size, id, rank, &config);
  }
  finish(result, call, __FILE__, __LINE__);
}

void NcclComms::adopt(ncclComm_t comm, const char* call) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    all_ = comm;
  }
  settle(call);
}

void NcclComms::split(int node, int local_rank, int rank, const char* call) {
  ncclConfig_t config = non_blocking_config();
  // Collective over every rank, in this order on each; the second waits for the first to settle.
  this->call(call, __FILE__, __LINE__, [&] { return ncclCommSplit(all_, node, rank, &local_, &config); });
  this->call(call, __FILE__, __LINE__, [&] { return ncclCommSplit(all_, local_rank, rank, &cross_, &config); });
}

void NcclComms::throw_if_aborted(const char* what) const {
  if (aborted_ || abort_deferred_) {
    throw CommunicationError(what, where_ + ": the communicator is aborted (" + abort_reason_ + ")", __FILE__,
                             __LINE__);
  }
}

void NcclComms::finish(ncclResult_t result, const char* what, const char* file, int line) {
  if (result == ncclSuccess) return;
  if (result == ncclInProgress) {
    settle(what);
    return;
  }
  // The call had no effect: the communicators are as they were.
  if (result == ncclInvalidArgument || result == ncclInvalidUsage) check_nccl(result, what, file, line);
  fail(where_ + ": " + what + " failed: " + nccl_reason(result, all_) +
           "; the communicator is aborted (ncclCommAbort): later collectives on it fail",
       what);
}

void NcclComms::settle(const char* what) {
  std::vector<ncclComm_t> comms;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    throw_if_aborted(what);
    comms = distinct();
  }
  for (ncclComm_t c : comms) wait_for(c, what);
}

void NcclComms::wait_for(ncclComm_t comm, const char* what) {
  const Settle s = wait_to_settle([&] { return state_of(comm); }, ncclInProgress, timeout_.load(),
                                  [this] { return aborted_.load(); });
  if (s.outcome == SettleOutcome::settled && s.state == ncclSuccess) return;
  if (s.outcome == SettleOutcome::stopped) {
    std::lock_guard<std::mutex> lock(mutex_);
    throw_if_aborted(what);
  }
  if (s.outcome == SettleOutcome::timed_out) {
    fail(where_ + ": " + what + " waited " + std::to_string(s.waited.count()) +
             " ms for the other ranks (GPUCLOUD_COMM_TIMEOUT): a rank is missing, stopped or dead, or the step "
             "needs longer than the timeout (then raise it: GPUCLOUD_COMM_TIMEOUT or set_timeout). The communicator "
             "is aborted (ncclCommAbort): later collectives on it fail",
         what);
  }
  fail(where_ + ": " + what + " failed: " + nccl_reason(static_cast<ncclResult_t>(s.state), comm) +
           "; the communicator is aborted (ncclCommAbort): later collectives on it fail",
       what);
}

void NcclComms::fail(const std::string& why, const char* what) {
  if (on_failure_) {
    on_failure_(why);
  } else {
    abort(why);
  }
  throw CommunicationError(what, why, __FILE__, __LINE__);
}

ncclResult_t NcclComms::async_error() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (aborted_) return ncclSuccess;
  for (ncclComm_t c : distinct()) {
    const ncclResult_t state = state_locked(c);
    if (state != ncclSuccess && state != ncclInProgress) return state;
  }
  return ncclSuccess;
}

ncclResult_t NcclComms::state_locked(ncclComm_t comm) const {
  ncclResult_t state = ncclSuccess;
  const ncclResult_t r = ncclCommGetAsyncError(comm, &state);
  return r != ncclSuccess ? r : state;
}

int NcclComms::state_of(ncclComm_t comm) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (aborted_) return static_cast<int>(ncclInProgress);  // freed: the wait's stop() ends it
  return static_cast<int>(state_locked(comm));
}

void NcclComms::abort(const std::string& why) noexcept {
  std::lock_guard<std::mutex> lock(mutex_);
  if (aborted_) return;
  try {
    if (abort_reason_.empty()) abort_reason_ = why;
  } catch (...) {  // out of memory for the reason: abort without it
  }
  if (open_groups_ > 0) {
    abort_deferred_ = true;  // the open group refers to the communicators: its end aborts them
    return;
  }
  abort_locked();
}

void NcclComms::abort_locked() noexcept {
  for (ncclComm_t c : distinct()) ncclCommAbort(c);
  aborted_ = true;
  abort_deferred_ = false;
}

}  // namespace gpucloud::detail
