#include "runtime/host/worker_wake.hpp"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>

namespace gpucloud::detail {

void WorkerWake::open() noexcept {
  event_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  timer_fd_ = timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC | TFD_NONBLOCK);
  if (!usable()) close();  // one without the other: neither (the condition variable serves)
}

void WorkerWake::close() noexcept {
  if (event_fd_ >= 0) ::close(event_fd_);
  if (timer_fd_ >= 0) ::close(timer_fd_);
  event_fd_ = timer_fd_ = -1;
}

void WorkerWake::now() noexcept {
  if (pending_) return;
  pending_ = true;
  const std::uint64_t one = 1;
  // EAGAIN only at a counter of 2^64 - 2: the sleeper is woken then all the same.
  while (::write(event_fd_, &one, sizeof one) < 0 && errno == EINTR) {
  }
}

void WorkerWake::arm(std::chrono::microseconds delay) noexcept {
  if (armed_) return;
  armed_ = true;
  itimerspec when{};
  when.it_value.tv_sec = static_cast<time_t>(delay.count() / 1000000);
  when.it_value.tv_nsec = static_cast<long>(delay.count() % 1000000) * 1000 + 1;  // never 0 (that disarms)
  (void)timerfd_settime(timer_fd_, 0, &when, nullptr);
}

void WorkerWake::disarm() noexcept {
  if (!armed_) return;
  armed_ = false;
  const itimerspec never{};
  (void)timerfd_settime(timer_fd_, 0, &never, nullptr);
}

void WorkerWake::sleep() noexcept {
  pollfd fds[2] = {{event_fd_, POLLIN, 0}, {timer_fd_, POLLIN, 0}};
  (void)::poll(fds, 2, -1);  // EINTR: the caller re-checks and sleeps again
  std::uint64_t count = 0;
  (void)!::read(event_fd_, &count, sizeof count);  // EAGAIN when not written: nothing to clear
  (void)!::read(timer_fd_, &count, sizeof count);
}

}  // namespace gpucloud::detail
