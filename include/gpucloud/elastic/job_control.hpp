/// @file job_control.hpp
/// @brief Preemption and restarts seen from inside a training job: a stop that every rank agrees
///        on at the same step, the restart count and reason the supervisor (gpucloud-run,
///        torchrun, Slurm's requeue) passed down, and a heartbeat the supervisor watches.
///
/// A trainer makes one JobControl at the start of main and calls should_stop() once per step,
/// after the step's work is enqueued. When it answers true (on every rank at the same call), the
/// trainer saves a checkpoint at that step and exits with kPreemptedExitCode; the supervisor or
/// the job script treats that status as "requeue", and the resumed run loses no step.
/// docs/fault-tolerance.md describes the whole protocol.
#pragma once

#include <gpucloud/export.hpp>
#include <gpucloud/memory/buffer.hpp>
#include <gpucloud/runtime/event.hpp>
#include <gpucloud/runtime/stream.hpp>

#include <csignal>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace gpucloud {
class Communicator;
}

namespace gpucloud::elastic {

/// @brief The exit status of a process that stopped for a preemption with its state saved
///        (sysexits' EX_TEMPFAIL): gpucloud-run and deploy/slurm's job scripts requeue on it.
inline constexpr int kPreemptedExitCode = 75;

/// @brief Which restart of the job this process belongs to, as its supervisor said.
struct RestartInfo {
  int count = 0;       ///< 0 for the first launch; the restarts before this one
  std::string reason;  ///< why the previous launch ended ("" for the first launch)
};

/// @brief Reads GPUCLOUD_RESTART_COUNT / GPUCLOUD_RESTART_REASON (gpucloud-run), else
///        TORCHELASTIC_RESTART_COUNT (torchrun), else SLURM_RESTART_COUNT (a requeued Slurm job).
/// @throws InvalidArgument naming the variable when its value is not a count.
GPUCLOUD_API RestartInfo restart_info_from_environment();

/// @brief How a JobControl listens.
struct JobControlOptions {
  /// Signals that ask for a stop at the next step (a cloud's preemption notice, Slurm's
  /// --signal, gpucloud-run passing one on). The process's previous handlers come back when
  /// the JobControl is destroyed.
  std::vector<int> signals{SIGTERM, SIGUSR1};
  /// When set, GPUCLOUD_STOP_SIGNALS replaces @p signals: names or numbers, comma-separated
  /// ("USR1", "TERM,USR1", "none"), so a launcher's convention can be followed without a rebuild
  /// (under torchrun, a trainer that catches SIGTERM makes torchrun's teardown of a failed
  /// group wait its 30 s for it).
  bool signals_from_environment = true;
};

/// @brief A job's stop decision and restart facts. One may live per process at a time.
class GPUCLOUD_API JobControl {
 public:
  /// @brief Installs the handlers of @p options.signals; reads the restart facts; opens the
  ///        heartbeat file when GPUCLOUD_RUN_DIR names the supervisor's directory
  ///        (GPUCLOUD_RUN_DIR/rank-R, one line: first step, latest step, the times of both in
  ///        seconds since the epoch, pid, state, host name; rewritten by every should_stop()).
  ///        State r: running; x: closed; e: closed by an error (the supervisor ends the launch
  ///        without waiting for its launcher).
  /// @throws InvalidArgument when another JobControl lives, for a signal that cannot be caught
  ///         (SIGKILL, SIGSTOP, out of range), or for a bad restart or signal variable.
  explicit JobControl(JobControlOptions options = {});
  /// @brief Restores the previous handlers; waits for the last agreement's work; marks the
  ///        heartbeat closed (the process did not die), or failed when an exception unwinds it.
  ~JobControl();
  JobControl(const JobControl&) = delete;
  JobControl& operator=(const JobControl&) = delete;

  /// @brief True once this process has received one of the signals (or request_stop()).
  bool stop_requested() const noexcept;
  /// @brief The signal that asked for the stop (0 for none, or for request_stop()).
  int stop_signal() const noexcept;
  /// @brief Asks for a stop, as a signal would (a preemption notice polled by the trainer).
  void request_stop() noexcept;
  /// @brief Marks this process as failing (heartbeat state e) from here on: what the destructor
  ///        does when an exception unwinds it, for a trainer that handles its error elsewhere.
  void mark_failed() noexcept;

  /// @brief Once per step, after step @p step's work is enqueued on @p stream: true when the
  ///        job must stop now with the state of @p step (steps done so far) saved. With @p comm
  ///        it is a collective: every rank calls it once per step, and all answer true at the
  ///        same call, one call after the first rank was asked to stop (a 1-element max
  ///        all-reduce per call, read one call later, so the stream never waits for the step).
  ///        Also beats the heartbeat.
  /// @throws InvalidArgument when @p stream is not on @p comm's device; what the all-reduce
  ///         throws (CommunicationError for a dead peer).
  bool should_stop(std::int64_t step, Communicator* comm, StreamView stream);
  /// @brief should_stop() of a single process: the local request alone.
  bool should_stop(std::int64_t step);

  /// @brief Which restart this process belongs to.
  const RestartInfo& restart() const noexcept { return restart_; }
  /// @brief The step of the first should_stop() call (one past where this launch resumed), -1 before.
  std::int64_t first_step() const noexcept { return first_step_; }

 private:
  void beat(std::int64_t step);
  void write_beat(std::int64_t step, char state);
  void mark_closed() noexcept;           // the heartbeat says closed (x, or e once failed)
  static void close_at_exit() noexcept;  // exit() without the destructor: marks the live one
  struct Handlers;                       // the process's previous signal handlers

  struct Slot {
    Buffer flag, host;  // the all-reduced flag on the communicator's device, and its host copy
    Event done;
    bool pending = false;
  };
  RestartInfo restart_;
  std::unique_ptr<Handlers> previous_;
  Slot slots_[2];
  int next_slot_ = 0;
  int heartbeat_fd_ = -1;
  std::int64_t first_step_ = -1;
  double first_beat_ = 0.0;  // seconds since the epoch
  std::int64_t last_step_ = -1;
  bool failed_ = false;  // mark_failed(): the closed heartbeat says e
  std::string host_;     // this node's name, for the supervisor's liveness checks
};

}  // namespace gpucloud::elastic
