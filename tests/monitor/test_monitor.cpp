// Device monitoring: the /proc parsers on fixed text, the summary's statistics and energy on
// synthetic readings, real host readings (a busy spin shows up as utilisation), the background
// monitor, bad arguments; on a GPU, NVML's memory total against the CUDA runtime's.
#include <gpucloud/monitor/monitor.hpp>
#include <gpucloud/runtime/device.hpp>
#include <gpucloud/runtime/error.hpp>

#include <gtest/gtest.h>

#include <cstdio>

#include "monitor/host/host_metrics.hpp"
#include "monitor/metrics_summary.hpp"

#include <time.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cmath>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace gc = gpucloud;
using namespace std::chrono_literals;

TEST(HostMetricsParsing, ProcStatAggregateLine) {
  const auto t =
      gc::detail::parse_proc_stat("cpu  100 5 20 800 10 1 2 3 50 0\ncpu0 50 2 10 400 5 0 1 1 0 0\nintr 12345\n");
  ASSERT_TRUE(t.has_value());
  EXPECT_EQ(t->busy, 100u + 5 + 20 + 1 + 2 + 3);  // guest (50) is already inside user
  EXPECT_EQ(t->total, t->busy + 800 + 10);
  EXPECT_FALSE(gc::detail::parse_proc_stat("cpu0 1 2 3\n").has_value());
  EXPECT_FALSE(gc::detail::parse_proc_stat("cpu 1 2 3\n").has_value());  // too few fields
  EXPECT_FALSE(gc::detail::parse_proc_stat("").has_value());
}

TEST(HostMetricsParsing, BusyPercentBetweenReadings) {
  const gc::detail::CpuTimes a{100, 1000}, b{175, 1100};
  EXPECT_DOUBLE_EQ(*gc::detail::busy_percent(a, b), 75.0);
  EXPECT_FALSE(gc::detail::busy_percent(a, a).has_value());  // no time passed
  EXPECT_FALSE(gc::detail::busy_percent(b, a).has_value());  // backwards
}

TEST(HostMetricsParsing, CpuinfoMeanClock) {
  const auto mhz = gc::detail::parse_cpuinfo_mhz(
      "processor\t: 0\ncpu MHz\t\t: 2000.000\nprocessor\t: 1\ncpu MHz\t\t: 3000.500\nflags : fpu\n");
  ASSERT_TRUE(mhz.has_value());
  EXPECT_DOUBLE_EQ(*mhz, 2500.25);
  EXPECT_FALSE(gc::detail::parse_cpuinfo_mhz("processor : 0\n").has_value());
}

TEST(MetricsSummary, StatisticsAndEnergyByTrapezoids) {
  const auto t0 = std::chrono::steady_clock::now();
  auto reading = [&](double seconds, std::optional<double> util, std::optional<double> watts, std::uint64_t used) {
    gc::DeviceMetrics m;
    m.when =
        t0 + std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(seconds));
    m.utilization = util;
    m.power_w = watts;
    m.memory_used = used;
    return m;
  };
  const std::vector<gc::DeviceMetrics> run = {reading(0, 10, 100, 5), reading(1, 50, 200, 9), reading(3, {}, 100, 7)};
  gc::MetricsSummary s;
  std::optional<gc::DeviceMetrics> previous;
  for (const auto& m : run) {
    gc::detail::accumulate(s, previous, m, t0);
    previous = m;
  }
  EXPECT_EQ(s.samples, 3u);
  EXPECT_NEAR(s.seconds, 3.0, 1e-9);
  EXPECT_EQ(s.utilization.count, 2u);  // the third reading had none
  EXPECT_DOUBLE_EQ(s.utilization.min, 10);
  EXPECT_DOUBLE_EQ(s.utilization.mean, 30);
  EXPECT_DOUBLE_EQ(s.utilization.max, 50);
  EXPECT_DOUBLE_EQ(s.memory_used.max, 9);
  EXPECT_DOUBLE_EQ(s.memory_used.min, 5);
  EXPECT_EQ(s.temperature_c.count, 0u);
  ASSERT_TRUE(s.energy_j.has_value());
  EXPECT_NEAR(*s.energy_j, 150.0 + 300.0, 1e-6);  // (100+200)/2 * 1 s + (200+100)/2 * 2 s
  gc::MetricsSummary no_power;
  gc::detail::accumulate(no_power, std::nullopt, reading(0, 1, {}, 1), t0);
  EXPECT_FALSE(no_power.energy_j.has_value());
  // A device with an energy counter (NVML's): its increase counts, not the integrated power.
  gc::MetricsSummary counted;
  std::optional<gc::DeviceMetrics> before;
  double joules = 5000;
  for (auto m : run) {
    m.energy_j = joules;
    joules += 40;  // 40 J between readings whatever the power said
    gc::detail::accumulate(counted, before, m, t0);
    before = m;
  }
  ASSERT_TRUE(counted.energy_j.has_value());
  EXPECT_NEAR(*counted.energy_j, 80.0, 1e-9);
}

namespace {

// The CPUs /proc/stat counts (a container may see more than nproc).
int proc_stat_cpus() {
  std::ifstream in("/proc/stat");
  std::string line;
  int n = 0;
  while (std::getline(in, line)) {
    if (line.size() > 3 && line.compare(0, 3, "cpu") == 0 && std::isdigit(static_cast<unsigned char>(line[3]))) ++n;
  }
  return n;
}

double process_cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) * 1e-9;
}

}  // namespace

TEST(Monitor, HostReadingAndABusySpinShowsUp) {
  const gc::DeviceMetrics idle = gc::read_metrics(gc::Device::host());
  EXPECT_EQ(idle.source, "procfs");
  EXPECT_EQ(idle.device, gc::Device::host());
  EXPECT_EQ(idle.memory_total, gc::memory_info(gc::Device::host()).total);
  EXPECT_GT(idle.memory_used, 0u);
  EXPECT_LE(idle.memory_used, idle.memory_total);
  ASSERT_TRUE(idle.utilization.has_value()) << "/proc/stat is readable on Linux";
  EXPECT_GE(*idle.utilization, 0.0);
  EXPECT_LE(*idle.utilization, 100.0);
  EXPECT_FALSE(idle.memory_utilization.has_value());  // a GPU-only figure

  // Spin every visible core for 400 ms between two readings.
  const unsigned spinners = std::max(1u, std::thread::hardware_concurrency());
  std::atomic<bool> go{true};
  std::vector<std::thread> threads;
  (void)gc::read_metrics(gc::Device::host());
  const auto start = std::chrono::steady_clock::now();
  const double cpu_before = process_cpu_seconds();
  for (unsigned i = 0; i < spinners; ++i) {
    threads.emplace_back([&] {
      volatile double x = 1;
      while (go.load(std::memory_order_relaxed)) x = x * 1.0000001 + 1e-9;
    });
  }
  std::this_thread::sleep_until(start + 400ms);
  const gc::DeviceMetrics busy = gc::read_metrics(gc::Device::host());
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const double used = process_cpu_seconds() - cpu_before;
  go = false;
  for (auto& t : threads) t.join();
  ASSERT_TRUE(busy.utilization.has_value());
  // The machine was at least as busy as this process made it (whatever a CPU quota allowed it);
  // allow for the jiffy granularity of /proc/stat.
  const int cpus = std::max(1, proc_stat_cpus());
  const double ours = 100.0 * used / (wall * cpus);
  // The spinners got at least a tenth of one CPU, however loaded the machine (ctest -j8 on 2 cores
  // gave them a fifth of the machine); the check below scales with what they got.
  EXPECT_GT(ours, 100.0 / cpus * 0.1) << "the spinners did not run";
  EXPECT_GT(*busy.utilization, 0.7 * ours) << spinners << " spinners, " << cpus << " CPUs in /proc/stat";
}

TEST(Monitor, BackgroundSamplerKeepsStatistics) {
  gc::MetricsMonitor monitor(gc::Device::host(), 20ms);
  // The background thread's own readings: wait (on a loaded machine, as long as it takes) until
  // it has taken three after the first, watching latest(), which takes none.
  std::vector<std::chrono::steady_clock::time_point> seen{monitor.latest().when};
  const auto give_up = std::chrono::steady_clock::now() + 120s;
  while (seen.size() < 4 && std::chrono::steady_clock::now() < give_up) {
    const auto when = monitor.latest().when;
    if (when != seen.back()) seen.push_back(when);
    std::this_thread::sleep_for(5ms);
  }
  ASSERT_EQ(seen.size(), 4u) << "the background sampler took no readings in 120 s";
  const gc::MetricsSummary s = monitor.summary();
  EXPECT_EQ(s.device, gc::Device::host());
  EXPECT_GE(s.samples, 5u);  // the first, three more in the background, the one summary() takes
  EXPECT_GT(s.seconds, 0.0);
  EXPECT_EQ(s.memory_used.count, s.samples);
  EXPECT_LE(s.memory_used.min, s.memory_used.mean);
  EXPECT_LE(s.memory_used.mean, s.memory_used.max);
  EXPECT_GE(s.utilization.count, s.samples - 1);
  EXPECT_EQ(s.energy_j.has_value(), s.power_w.count > 0);
  const auto latest = monitor.latest();
  EXPECT_EQ(latest.source, "procfs");

  monitor.reset();
  const gc::MetricsSummary after = monitor.summary();
  EXPECT_EQ(after.samples, 1u);  // only the reading summary() took
  monitor.stop();
  monitor.stop();  // idempotent
  EXPECT_EQ(monitor.summary().samples, 2u);

  gc::MetricsMonitor moved = std::move(monitor);
  EXPECT_EQ(moved.latest().source, "procfs");
  EXPECT_THROW((void)monitor.latest(), gc::InvalidArgument);  // NOLINT(bugprone-use-after-move)
}

TEST(Monitor, BadIntervalIsRejected) {
  try {
    gc::MetricsMonitor m(gc::Device::host(), 5ms);
    FAIL() << "no error";
  } catch (const gc::InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("interval: 5 ms is shorter than the 10 ms minimum"), std::string::npos)
        << e.what();
  }
}

// The health counters a data-center GPU reports through NVML (what DCGM exports): an XID
// reading (0 until one occurs), the PCIe replay counter, the throttle reasons, the power limit and
// the energy counter; ECC where the GPU has it on. Runs in scripts/gpu-check.sh.
TEST(Monitor, GpuHealthCountersAreRead) {
  if (gc::cuda_device_count() == 0) GTEST_SKIP() << "needs a CUDA device: " << gc::cuda_unavailable_reason();
  if (!gc::nvml_unavailable_reason().empty()) GTEST_SKIP() << "no NVML: " << gc::nvml_unavailable_reason();
  const gc::DeviceMetrics m = gc::read_metrics(gc::Device::cuda(0));
  const auto& h = m.health;
  ASSERT_TRUE(h.xid.has_value());
  EXPECT_GE(*h.xid, 0.0);
  ASSERT_TRUE(h.pcie_replay_counter.has_value());
  EXPECT_GE(*h.pcie_replay_counter, 0.0);
  ASSERT_TRUE(h.throttle_reasons.has_value());
  EXPECT_GE(*h.throttle_reasons, 0.0);
  ASSERT_TRUE(m.power_limit_w.has_value());
  EXPECT_GT(*m.power_limit_w, 10.0);
  ASSERT_TRUE(m.energy_j.has_value());
  EXPECT_GT(*m.energy_j, 0.0);
  // Corrected and uncorrected counts come together, or not at all (ECC off, consumer GPUs).
  EXPECT_EQ(h.ecc_sbe_volatile.has_value(), h.ecc_dbe_volatile.has_value());
  std::printf(
      "health: xid %g, pcie replays %g, throttle 0x%llx, power limit %g W, energy %g J, ECC %s, "
      "remapped rows %s\n",
      *h.xid, *h.pcie_replay_counter, static_cast<unsigned long long>(*h.throttle_reasons), *m.power_limit_w,
      *m.energy_j, h.ecc_dbe_volatile ? ("DBE " + std::to_string(*h.ecc_dbe_volatile)).c_str() : "not reported",
      h.remapped_rows_uncorrectable ? std::to_string(*h.remapped_rows_uncorrectable).c_str() : "not reported");
}

TEST(Monitor, GpuReadingMatchesTheRuntime) {
  if (gc::cuda_device_count() == 0) {
    EXPECT_NE(gc::nvml_unavailable_reason(), "");  // says why: no device
    GTEST_SKIP() << "needs a CUDA device: " << gc::cuda_unavailable_reason();
  }
  const gc::Device d = gc::Device::cuda(0);
  const gc::DeviceMetrics m = gc::read_metrics(d);
  const gc::MemoryInfo runtime = gc::memory_info(d);
  EXPECT_EQ(m.device, d);
  // NVML's total counts memory the runtime reserves; they agree to a few percent.
  EXPECT_NEAR(static_cast<double>(m.memory_total), static_cast<double>(runtime.total),
              0.05 * static_cast<double>(runtime.total));
  EXPECT_LE(m.memory_used, m.memory_total);
  if (gc::nvml_unavailable_reason().empty()) {
    EXPECT_EQ(m.source, "nvml");
    ASSERT_TRUE(m.utilization.has_value());
    EXPECT_LE(*m.utilization, 100.0);
    if (m.temperature_c) {
      EXPECT_GT(*m.temperature_c, 0.0);
    }
    if (m.power_w) {
      EXPECT_GT(*m.power_w, 0.0);
    }
    if (m.clock_mhz) {
      EXPECT_GT(*m.clock_mhz, 100.0);
    }
  } else {
    EXPECT_EQ(m.source, "cuda");
  }
  gc::MetricsMonitor monitor(d, 50ms);
  std::this_thread::sleep_for(200ms);
  EXPECT_GE(monitor.summary().samples, 3u);
}
