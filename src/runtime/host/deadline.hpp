// Internal: blocking calls on a host stream's worker under a deadline (not API).
#pragma once

#include <chrono>
#include <exception>
#include <functional>

namespace gpucloud::detail {

/// Runs @p blocking on the calling host-stream worker (a call that may never return, such as a
/// blocking MPI collective whose peers died) at full speed, watched by one process-wide watchdog
/// thread. If it has not returned after @p timeout, the watchdog calls @p on_timeout for the
/// error, the task running it fails with that error and the stream goes on with a new worker
/// (HostStream::abandon_running_task): callers waiting on the stream get the error instead of a
/// hang. Should @p blocking return after that, this throws instead of returning, so the rest of
/// the task (which may touch freed memory) never runs. Off a host-stream worker there is no one
/// to abandon: @p blocking simply runs.
void run_with_deadline(std::chrono::milliseconds timeout, const std::function<void()>& blocking,
                       const std::function<std::exception_ptr()>& on_timeout);

}  // namespace gpucloud::detail
