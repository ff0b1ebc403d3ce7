// Internal: how a host stream's sleeping worker is woken, at once or after a delay (not API).
#pragma once

#include <chrono>

namespace gpucloud::detail {

/// A sleeping worker's wake-ups: an eventfd for "now" and a timerfd for "unless someone else
/// takes the work first" (HostStream::push), so that work a waiting caller will run itself costs
/// no wake-up of a thread that would only compete with it for a core. Without its descriptors (the
/// process is out of them) usable() is false and the stream wakes its worker through a condition
/// variable instead. Neither copied nor moved (a stream owns one); the caller serialises every
/// call but sleep(), which only reads the descriptors (HostStream: under its mutex).
class WorkerWake {
 public:
  WorkerWake() noexcept { open(); }
  ~WorkerWake() { close(); }
  WorkerWake(const WorkerWake&) = delete;
  WorkerWake& operator=(const WorkerWake&) = delete;

  /// Whether both descriptors exist (else the caller uses its condition variable).
  bool usable() const noexcept { return event_fd_ >= 0 && timer_fd_ >= 0; }
  /// Wakes the sleeper now (or its next sleep returns at once); once until woke().
  void now() noexcept;
  /// Wakes the sleeper after @p delay unless disarm() or woke() comes first; an armed delay stays.
  void arm(std::chrono::microseconds delay) noexcept;
  /// Cancels a wake-up arm() set (nothing when none is armed).
  void disarm() noexcept;
  /// Sleeps until now() or an armed delay has passed (or a signal: callers re-check their
  /// condition), then clears both. The one call that may overlap the others.
  void sleep() noexcept;
  /// The sleeper, back from sleep(): no wake-up is pending or armed any more.
  void woke() noexcept {
    pending_ = false;
    disarm();
  }
  /// Whether now() has been called since the sleeper last woke().
  bool pending() const noexcept { return pending_; }
  /// In a fork() child: new descriptors, the parent's (shared with it) closed.
  void reopen_in_child() noexcept {
    close();
    open();
    pending_ = armed_ = false;
  }

 private:
  void open() noexcept;
  void close() noexcept;
  int event_fd_ = -1;
  int timer_fd_ = -1;
  bool pending_ = false;  // now() since woke()
  bool armed_ = false;    // arm() not yet fired, disarmed or woken from
};

}  // namespace gpucloud::detail
