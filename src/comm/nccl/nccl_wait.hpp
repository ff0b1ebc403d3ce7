// Internal: waiting out a non-blocking NCCL communicator's "in progress" against a deadline (not
// API).
//
// With ncclConfig_t.blocking = 0, init, split, finalize, group end and (rarely) a collective return
// ncclInProgress at once; the communicator's state (ncclCommGetAsyncError) then says when the call
// has settled, and no other NCCL call may be made on it before. A peer that never comes keeps the
// state in progress for ever: this wait is where the timeout fires. Plain host logic (the query is
// a callable), so that the host tests run it without NCCL.
#pragma once

#include <algorithm>
#include <chrono>
#include <thread>

namespace gpucloud::detail {

/// How a wait for a settled state ended.
enum class SettleOutcome {
  settled,    ///< the state is no longer in progress (success or an error: see Settle::state)
  timed_out,  ///< still in progress when the timeout passed
  stopped,    ///< stop() said to give up (the communicator was aborted meanwhile)
};

/// The end of a wait: how, the last state seen, and the time waited.
struct Settle {
  SettleOutcome outcome;
  int state;
  std::chrono::milliseconds waited;
};

/// Polls @p query() (the state; @p in_progress while the call runs) until it returns another value,
/// @p timeout has passed, or @p stop() is true. The first poll is immediate, then the sleeps grow
/// from 10 µs to 1 ms: a call that settles at once costs nothing, a long wait costs no CPU.
template <class Query, class Stop>
Settle wait_to_settle(Query&& query, int in_progress, std::chrono::milliseconds timeout, Stop&& stop) {
  using clock = std::chrono::steady_clock;
  const auto start = clock::now();
  auto pause = std::chrono::microseconds(10);
  for (;;) {
    const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(clock::now() - start);
    if (stop()) return {SettleOutcome::stopped, in_progress, waited};
    const int state = query();
    if (state != in_progress) return {SettleOutcome::settled, state, waited};
    if (waited >= timeout) return {SettleOutcome::timed_out, state, waited};
    std::this_thread::sleep_for(pause);
    pause = std::min<std::chrono::microseconds>(pause * 2, std::chrono::milliseconds(1));
  }
}

}  // namespace gpucloud::detail
