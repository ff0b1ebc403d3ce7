// Internal: one rank's NCCL communicators (every rank's, its node's, the cross-node one), created
// non-blocking, so that no NCCL call can wait for a missing peer past the timeout (not API).
//
// Every NCCL call on them runs under one mutex, held for the call only; a call that answers
// ncclInProgress (init, split, finalize, group end, a collective that connects lazily) is waited
// out with the mutex released between polls of ncclCommGetAsyncError, against the timeout. So the
// watchdog's abort, the one call another thread makes at any time, never waits behind a peer. A
// timeout or an NCCL error aborts the communicators (ncclCommAbort) and throws
// CommunicationError. PyTorch's ProcessGroupNCCL handles its non-blocking communicators this way.
#pragma once

#include <nccl.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

namespace gpucloud::detail {

/// NCCL_CONFIG_INITIALIZER with blocking = 0: every communicator here is made so.
ncclConfig_t non_blocking_config();

class NcclComms {
 public:
  /// @p where names the rank in messages; @p timeout is read at every wait (set_timeout changes it).
  NcclComms(std::string where, const std::atomic<std::chrono::milliseconds>& timeout);
  /// Finalizes and destroys the communicators, never waiting past the timeout: a finalize that does
  /// not settle in time (a peer gone with a collective pending) aborts them instead. Never throws.
  ~NcclComms();
  NcclComms(const NcclComms&) = delete;
  NcclComms& operator=(const NcclComms&) = delete;

  /// Called with the reason when a wait times out or NCCL fails, before the throw (the
  /// communicator breaks itself and aborts through abort()); by default only abort().
  void on_failure(std::function<void(const std::string&)> fail) { on_failure_ = std::move(fail); }

  /// ncclCommInitRankConfig (non-blocking), waited out: @p call names the caller in errors.
  void init_rank(const ncclUniqueId& id, int rank, int size, const char* call);
  /// Takes @p comm, made non-blocking elsewhere (a grouped init), and waits for it to settle.
  void adopt(ncclComm_t comm, const char* call);
  /// ncclCommSplit into the node's ranks (@p node's) and the cross-node ranks (@p local_rank's).
  void split(int node, int local_rank, int rank, const char* call);
  /// With one node, the node's communicator is the whole one; with one rank per node, so is the
  /// cross-node one.
  void alias_local() noexcept { local_ = all_; }
  void alias_cross() noexcept { cross_ = all_; }

  ncclComm_t all() const noexcept { return all_; }      ///< Every rank.
  ncclComm_t local() const noexcept { return local_; }  ///< This node's ranks, or null.
  ncclComm_t cross() const noexcept { return cross_; }  ///< This local rank on every node, or null.

  /// Runs @p fn (an NCCL call on these communicators) under the mutex and waits out its
  /// ncclInProgress; @p what, @p file, @p line name it in errors.
  /// @throws CommunicationError after an abort, a timeout or an NCCL error; InvalidArgument for
  /// NCCL's invalid argument or usage.
  template <class Fn>
  void call(const char* what, const char* file, int line, Fn fn) {
    ncclResult_t result;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      throw_if_aborted(what);
      result = fn();
    }
    finish(result, what, file, line);
  }
  /// Waits until every communicator has left ncclInProgress (after a group end), as call() does.
  void settle(const char* what);

  /// The first asynchronous error of any communicator (ncclSuccess or ncclInProgress when none),
  /// for the watchdog; ncclSuccess once aborted.
  ncclResult_t async_error();
  /// Aborts every communicator (ncclCommAbort: kernels return), once, recording @p why. Inside an
  /// open group the abort waits for the group's end (the group still refers to them). Never throws.
  void abort(const std::string& why) noexcept;
  /// True once aborted.
  bool aborted() const noexcept { return aborted_.load(); }

  /// Group end (comm_group): the mutex of every member, taken in one order.
  std::mutex& mutex() noexcept { return mutex_; }
  /// A group with a call on these communicators has opened (mutex held).
  void group_opened() noexcept { ++open_groups_; }
  /// That group has ended (mutex held): an abort that waited for it runs now.
  void group_closed() noexcept {
    if (--open_groups_ == 0 && abort_deferred_) abort_locked();
  }

 private:
  void finish(ncclResult_t result, const char* what, const char* file, int line);
  void throw_if_aborted(const char* what) const;  // mutex held
  void wait_for(ncclComm_t comm, const char* what);
  ncclResult_t state_locked(ncclComm_t comm) const;  // ncclCommGetAsyncError's state (mutex held)
  int state_of(ncclComm_t comm);                     // the same under the mutex; in progress once aborted (for waits)
  [[noreturn]] void fail(const std::string& why, const char* what);
  void abort_locked() noexcept;  // mutex held
  std::vector<ncclComm_t> distinct() const;

  std::string where_;
  const std::atomic<std::chrono::milliseconds>& timeout_;
  std::function<void(const std::string&)> on_failure_;
  std::mutex mutex_;  // every NCCL call on the communicators; aborted_'s writes
  ncclComm_t all_ = nullptr, local_ = nullptr, cross_ = nullptr;
  std::atomic<bool> aborted_{false};
  std::string abort_reason_;  // mutex held
  int open_groups_ = 0;       // mutex held
  bool abort_deferred_ = false;
};

}  // namespace gpucloud::detail

/// Runs NCCL call @p expr on NcclComms @p comms (its communicators by comms.all() etc.).
#define GPUCLOUD_NCCL_CALL(comms, expr) (comms).call(#expr, __FILE__, __LINE__, [&] { return (expr); })
