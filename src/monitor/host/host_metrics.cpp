// The host device's metrics: /proc/stat (utilisation), /proc/meminfo through memory_info,
// /sys/class/thermal (temperature), /sys/class/powercap RAPL (power; usually root only),
// /proc/cpuinfo (clock). A file that is missing or unreadable leaves its figure empty.
#include "monitor/host/host_metrics.hpp"

#include <gpucloud/runtime/device.hpp>

#include <dirent.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <sstream>
#include <thread>
#include <vector>

namespace gpucloud::detail {

namespace {

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  if (!in) return {};
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

std::optional<double> read_number(const std::string& path) {
  const std::string text = read_text(path);
  if (text.empty()) return std::nullopt;
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (end == text.c_str()) return std::nullopt;
  return v;
}

// Entries of @p dir whose name starts with @p prefix.
std::vector<std::string> entries(const std::string& dir, const std::string& prefix) {
  std::vector<std::string> out;
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return out;
  while (const dirent* e = readdir(d)) {
    const std::string name = e->d_name;
    if (name.compare(0, prefix.size(), prefix) == 0) out.push_back(dir + "/" + name);
  }
  closedir(d);
  std::sort(out.begin(), out.end());
  return out;
}

std::optional<double> hottest_thermal_zone() {
  std::optional<double> hottest;
  for (const std::string& zone : entries("/sys/class/thermal", "thermal_zone")) {
    const auto milli = read_number(zone + "/temp");
    if (milli && *milli > -100000 && (!hottest || *milli / 1000 > *hottest)) hottest = *milli / 1000;
  }
  return hottest;
}

// Microjoules of every CPU package's RAPL domain (top-level intel-rapl:N), and their wrap range.
struct Energy {
  double microjoules = 0;
  double range = 0;
  std::size_t domains = 0;
};

std::optional<Energy> rapl_energy() {
  Energy e;
  for (const std::string& domain : entries("/sys/class/powercap", "intel-rapl:")) {
    if (domain.find(':', domain.rfind('/') + 11) != std::string::npos) continue;  // a sub-domain
    const auto uj = read_number(domain + "/energy_uj");
    if (!uj) continue;
    e.microjoules += *uj;
    e.range += read_number(domain + "/max_energy_range_uj").value_or(0);
    ++e.domains;
  }
  if (e.domains == 0) return std::nullopt;
  return e;
}

// The previous reading, for the figures measured over a period.
struct Previous {
  std::mutex mutex;
  bool valid = false;
  CpuTimes cpu;
  std::optional<Energy> energy;
  std::chrono::steady_clock::time_point when;
  std::optional<double> utilization, power_w;  // the last figures, reused for readings < 10 ms apart
};

Previous& previous() {
  static Previous p;
  return p;
}

std::optional<CpuTimes> cpu_times() { return parse_proc_stat(read_text("/proc/stat")); }

}  // namespace

std::optional<CpuTimes> parse_proc_stat(const std::string& text) {
  std::istringstream in(text);
  std::string label;
  if (!(in >> label) || label != "cpu") return std::nullopt;
  std::uint64_t f[8] = {};  // user nice system idle iowait irq softirq steal (guest is inside user)
  for (auto& v : f) {
    if (!(in >> v)) return std::nullopt;
  }
  CpuTimes t;
  t.busy = f[0] + f[1] + f[2] + f[5] + f[6] + f[7];
  t.total = t.busy + f[3] + f[4];
  return t;
}

std::optional<double> parse_cpuinfo_mhz(const std::string& text) {
  std::istringstream in(text);
  std::string line;
  double sum = 0;
  int cores = 0;
  while (std::getline(in, line)) {
    if (line.compare(0, 7, "cpu MHz") != 0) continue;
    const auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    char* end = nullptr;
    const double mhz = std::strtod(line.c_str() + colon + 1, &end);
    if (end == line.c_str() + colon + 1) continue;
    sum += mhz;
    ++cores;
  }
  if (cores == 0) return std::nullopt;
  return sum / cores;
}

std::optional<double> busy_percent(const CpuTimes& before, const CpuTimes& after) {
  if (after.total <= before.total || after.busy < before.busy) return std::nullopt;
  const double busy = static_cast<double>(after.busy - before.busy);
  return std::min(100.0, 100.0 * busy / static_cast<double>(after.total - before.total));
}

void read_host_metrics(DeviceMetrics& m) {
  m.source = "procfs";
  const MemoryInfo mem = memory_info(Device::host());
  m.memory_total = mem.total;
  m.memory_used = mem.total - std::min(mem.free, mem.total);
  m.temperature_c = hottest_thermal_zone();
  m.clock_mhz = parse_cpuinfo_mhz(read_text("/proc/cpuinfo"));

  Previous& p = previous();
  std::lock_guard<std::mutex> lock(p.mutex);
  if (!p.valid) {  // no period yet: measure one of 100 ms
    if (const auto t = cpu_times()) {
      p.cpu = *t;
      p.energy = rapl_energy();
      p.when = std::chrono::steady_clock::now();
      p.valid = true;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }
  const auto now = std::chrono::steady_clock::now();
  const auto cpu = cpu_times();
  if (!p.valid || !cpu) {  // no /proc/stat: no utilisation
    m.when = now;
    return;
  }
  const double seconds = std::chrono::duration<double>(now - p.when).count();
  if (seconds >= 0.01) {
    p.utilization = busy_percent(p.cpu, *cpu);
    const auto energy = rapl_energy();
    p.power_w.reset();
    if (energy && p.energy && energy->domains == p.energy->domains) {
      double delta = energy->microjoules - p.energy->microjoules;
      if (delta < 0) delta += energy->range;  // a counter wrapped
      if (delta >= 0) p.power_w = delta / 1e6 / seconds;
    }
    p.cpu = *cpu;
    p.energy = energy;
    p.when = now;
  }
  m.utilization = p.utilization;
  m.power_w = p.power_w;
  m.when = now;
}

}  // namespace gpucloud::detail
