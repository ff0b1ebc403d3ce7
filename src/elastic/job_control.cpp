// JobControl: signal handlers that only set a flag, the stop agreed through a one-step-late
// all-reduce, the restart facts from the environment, and the heartbeat file gpucloud-run reads.
#include <gpucloud/comm/communicator.hpp>
#include <gpucloud/compute/cast.hpp>
#include <gpucloud/elastic/job_control.hpp>
#include <gpucloud/movement/copy.hpp>
#include <gpucloud/runtime/error.hpp>

#include "memory/workspace.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>

namespace gpucloud::elastic {
namespace {

// Process-wide, as signals are: written by the handler (async-signal-safe: lock-free atomics).
std::atomic<int> g_stop_requested{0};
std::atomic<int> g_stop_signal{0};
std::atomic<bool> g_control_alive{false};
std::atomic<elastic::JobControl*> g_live{nullptr};  // for exit() without the destructor
static_assert(std::atomic<int>::is_always_lock_free, "the signal handler needs lock-free atomics");

extern "C" void on_stop_signal(int signo) {
  int none = 0;
  g_stop_signal.compare_exchange_strong(none, signo);  // the first signal is the one reported
  g_stop_requested.store(1);
}

// A count from @p name, or nullopt when it is unset or empty.
bool read_count(const char* name, int& out) {
  const char* text = std::getenv(name);
  if (text == nullptr || *text == '\0') return false;
  char* end = nullptr;
  errno = 0;
  const long v = std::strtol(text, &end, 10);
  if (errno != 0 || *end != '\0' || v < 0 || v > 1000000)
    throw InvalidArgument("restart_info_from_environment",
                          std::string(name) + "='" + text + "' is not a restart count (0 or more)", __FILE__, __LINE__);
  out = static_cast<int>(v);
  return true;
}

double wall_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

RestartInfo restart_info_from_environment() {
  RestartInfo info;
  if (read_count("GPUCLOUD_RESTART_COUNT", info.count)) {
    const char* reason = std::getenv("GPUCLOUD_RESTART_REASON");
    info.reason = reason ? reason : "";
  } else if (read_count("TORCHELASTIC_RESTART_COUNT", info.count)) {
    info.reason = info.count > 0 ? "restarted by torchrun" : "";
  } else if (read_count("SLURM_RESTART_COUNT", info.count)) {
    info.reason = info.count > 0 ? "requeued by Slurm" : "";
  }
  return info;
}

struct JobControl::Handlers {
  std::vector<int> signals;
  std::vector<struct sigaction> previous;
};

// GPUCLOUD_STOP_SIGNALS: "TERM,USR1", "SIGUSR1", "15", "none".
static std::vector<int> signals_from_environment(const char* text) {
  std::vector<int> out;
  const std::string all(text);
  if (all == "none") return out;
  std::size_t begin = 0;
  while (begin <= all.size()) {
    const std::size_t end = std::min(all.find(',', begin), all.size());
    std::string name = all.substr(begin, end - begin);
    if (name.rfind("SIG", 0) == 0) name = name.substr(3);
    int signo = 0;
    for (int s = 1; s < NSIG && signo == 0; ++s) {
      const char* abbrev = sigabbrev_np(s);
      if (abbrev != nullptr && name == abbrev) signo = s;
    }
    if (signo == 0 && !name.empty() && name.find_first_not_of("0123456789") == std::string::npos && name.size() < 4)
      signo = std::stoi(name);
    if (signo == 0)
      throw InvalidArgument("JobControl",
                            "GPUCLOUD_STOP_SIGNALS='" + all + "': '" + all.substr(begin, end - begin) +
                                "' is not a signal (names like TERM or USR1, or numbers, comma-separated; or none)",
                            __FILE__, __LINE__);
    out.push_back(signo);
    begin = end + 1;
  }
  return out;
}

JobControl::JobControl(JobControlOptions options) : restart_(restart_info_from_environment()) {
  if (const char* text = std::getenv("GPUCLOUD_STOP_SIGNALS"); options.signals_from_environment && text && *text)
    options.signals = signals_from_environment(text);
  for (int s : options.signals) {
    if (s <= 0 || s >= NSIG || s == SIGKILL || s == SIGSTOP)
      throw InvalidArgument("JobControl", "signal " + std::to_string(s) + " cannot be caught", __FILE__, __LINE__);
  }
  // The supervisor's directory: this rank's heartbeat goes to GPUCLOUD_RUN_DIR/rank-R, for hang
  // and death detection and the steps a restart lost.
  std::string heartbeat;
  if (const char* dir = std::getenv("GPUCLOUD_RUN_DIR"); dir && *dir)
    heartbeat = std::string(dir) + "/rank-" + std::to_string(launch_info_from_environment().rank);
  previous_ = std::make_unique<Handlers>();
  bool expected = false;
  if (!g_control_alive.compare_exchange_strong(expected, true))
    throw InvalidArgument("JobControl", "another JobControl lives in this process (signals are process-wide)", __FILE__,
                          __LINE__);
  g_stop_requested.store(0);
  g_stop_signal.store(0);
  previous_->signals.reserve(options.signals.size());
  previous_->previous.reserve(options.signals.size());
  for (int s : options.signals) {
    struct sigaction act {};
    act.sa_handler = on_stop_signal;
    sigemptyset(&act.sa_mask);
    act.sa_flags = SA_RESTART;
    struct sigaction old {};
    sigaction(s, &act, &old);  // cannot fail: the signal was checked above
    previous_->signals.push_back(s);
    previous_->previous.push_back(old);
  }
  g_live.store(this);
  static const bool at_exit_registered = std::atexit(&JobControl::close_at_exit) == 0;
  (void)at_exit_registered;
  if (!heartbeat.empty()) {
    char host[128] = {};
    ::gethostname(host, sizeof host - 1);
    host_ = host[0] ? host : "?";
    heartbeat_fd_ = ::open(heartbeat.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (heartbeat_fd_ < 0)
      std::fprintf(stderr, "gpucloud: JobControl: no heartbeat (%s: %s)\n", heartbeat.c_str(), std::strerror(errno));
  }
}

JobControl::~JobControl() {
  for (Slot& slot : slots_) {
    if (!slot.pending) continue;
    try {
      slot.done.synchronize();
    } catch (...) {  // a broken communicator: its error was or will be raised where it is used
    }
  }
  for (std::size_t i = 0; i < previous_->signals.size(); ++i)
    sigaction(previous_->signals[i], &previous_->previous[i], nullptr);
  g_live.store(nullptr);
  if (std::uncaught_exceptions() > 0) failed_ = true;  // unwound by an error: the launch has failed
  mark_closed();
  if (heartbeat_fd_ >= 0) ::close(heartbeat_fd_);
  g_control_alive.store(false);
}

void JobControl::mark_closed() noexcept {
  if (heartbeat_fd_ >= 0) write_beat(last_step_, failed_ ? 'e' : 'x');  // -1 steps: before its first step
}

void JobControl::mark_failed() noexcept { failed_ = true; }

void JobControl::close_at_exit() noexcept {
  if (JobControl* live = g_live.exchange(nullptr)) live->mark_closed();
}

bool JobControl::stop_requested() const noexcept { return g_stop_requested.load() != 0; }
int JobControl::stop_signal() const noexcept { return g_stop_signal.load(); }
void JobControl::request_stop() noexcept { g_stop_requested.store(1); }

void JobControl::beat(std::int64_t step) {
  if (first_step_ < 0) {
    first_step_ = step;
    first_beat_ = wall_seconds();
  }
  last_step_ = step;
  if (heartbeat_fd_ >= 0) write_beat(step, 'r');
}

void JobControl::write_beat(std::int64_t step, char state) {
  // "first-step latest-step first-time latest-time pid state host" (r: running, x: closed, e: failed):
  // every step (a pwrite into the page cache, about a microsecond), one padded line at offset 0;
  // a reader that catches it half-written reads it again later.
  char line[256];
  const int n = std::snprintf(line, sizeof line, "%lld %lld %.3f %.3f %d %c %s", static_cast<long long>(first_step_),
                              static_cast<long long>(step), first_beat_, wall_seconds(), static_cast<int>(::getpid()),
                              state, host_.c_str());
  char padded[192];
  std::memset(padded, ' ', sizeof padded);
  std::memcpy(padded, line, std::min(static_cast<std::size_t>(n), sizeof padded - 1));
  padded[sizeof padded - 1] = '\n';
  if (::pwrite(heartbeat_fd_, padded, sizeof padded, 0) < 0) {
    ::close(heartbeat_fd_);  // the directory is gone: the supervisor is; keep training
    heartbeat_fd_ = -1;
  }
}

bool JobControl::should_stop(std::int64_t step) {
  beat(step);
  return stop_requested();
}

bool JobControl::should_stop(std::int64_t step, Communicator* comm, StreamView stream) {
  if (comm == nullptr) return should_stop(step);
  if (stream.device() != comm->device())
    throw InvalidArgument(
        "JobControl::should_stop",
        "stream: on " + stream.device().str() + ", the communicator's buffers on " + comm->device().str(), __FILE__,
        __LINE__);
  beat(step);
  // The previous call's agreement has had a whole step to complete: read it.
  Slot& previous = slots_[next_slot_ ^ 1];
  bool agreed = false;
  if (previous.pending) {
    previous.done.synchronize();
    previous.pending = false;
    agreed = previous.host.data_as<std::int32_t>()[0] != 0;
  }
  // This call's: every rank's request, max-reduced, copied to the host, read at the next call.
  Slot& slot = slots_[next_slot_];
  if (slot.flag.empty() || slot.flag.device() != comm->device()) {
    // From the built-in resources: a JobControl is made first in main and outlives any resource
    // the trainer installs as the default after it.
    slot.flag = Buffer(1, DType::int32, comm->device(), MemoryKind::device,
                       detail::builtin_resource(MemoryKind::device, comm->device()));
    slot.host = Buffer(1, DType::int32, Device::host(), MemoryKind::pinned,
                       detail::builtin_resource(MemoryKind::pinned, Device::host()));
    slot.done = Event(comm->device());
  }
  fill(slot.flag, std::int32_t{stop_requested() ? 1 : 0}, stream);
  comm->all_reduce(slot.flag, slot.flag, ReduceOp::max, stream);
  copy(slot.host, slot.flag, stream);
  slot.done.record(stream);
  slot.pending = true;
  next_slot_ ^= 1;
  return agreed;
}

}  // namespace gpucloud::elastic
