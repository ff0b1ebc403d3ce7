#include "runtime/host/thread_budget.hpp"

#include "runtime/host/cgroup.hpp"

#include <sched.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <thread>

namespace gpucloud::detail {
namespace {

std::atomic<int> busy_threads{0};

HostThreads compute_budget() {
  HostThreads t;
  const int hardware = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  int cpus = hardware;
  char buf[160];
  cpu_set_t mask;
  CPU_ZERO(&mask);
  if (sched_getaffinity(0, sizeof(mask), &mask) == 0 && CPU_COUNT(&mask) > 0) cpus = CPU_COUNT(&mask);
  std::snprintf(buf, sizeof(buf), "affinity %d of %d cores", cpus, hardware);
  t.reason = buf;
  if (const std::optional<double> quota = cgroup_cpu_limit()) {
    const int granted = std::max(1, static_cast<int>(std::ceil(*quota - 1e-9)));
    std::snprintf(buf, sizeof(buf), ", cgroup quota %.2f CPUs", *quota);
    t.reason += buf;
    cpus = std::min(cpus, granted);
  }
  t.cpus = cpus;
  t.pool = cpus;
  if (const char* env = std::getenv(kHostThreadsEnv)) {
    const long v = std::strtol(env, nullptr, 10);
    if (v >= 1 && v <= 1024) {
      t.pool = static_cast<int>(v);
      t.reason += std::string(", ") + kHostThreadsEnv + "=" + env;
    }
  }
  const bool blas_set = std::getenv("OPENBLAS_NUM_THREADS") != nullptr || std::getenv("GOTO_NUM_THREADS") != nullptr ||
                        std::getenv("OMP_NUM_THREADS") != nullptr;
  t.blas = blas_set ? 0 : t.pool;
  return t;
}

}  // namespace

const HostThreads& thread_budget() noexcept {
  static const HostThreads budget = compute_budget();
  return budget;
}

int busy_library_threads() noexcept { return busy_threads.load(std::memory_order_relaxed); }

BusyLibraryThread::BusyLibraryThread() noexcept { busy_threads.fetch_add(1, std::memory_order_relaxed); }
BusyLibraryThread::~BusyLibraryThread() { busy_threads.fetch_sub(1, std::memory_order_relaxed); }

}  // namespace gpucloud::detail
