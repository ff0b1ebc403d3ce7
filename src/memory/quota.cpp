#include <gpucloud/memory/quota.hpp>
#include <gpucloud/runtime/error.hpp>

#include "memory/host_memory.hpp"
#include "memory/quota_ledger.hpp"

#include <array>
#include <atomic>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <mutex>
#include <sstream>

namespace gpucloud {
namespace {

constexpr std::size_t kNoLimit = std::numeric_limits<std::size_t>::max();
constexpr int kMaxGpus = 64;

// One device's account: lock-free on the allocation path; the limit's source under a mutex.
struct Account {
  std::atomic<std::size_t> limit{kNoLimit};
  std::atomic<std::size_t> held{0};
  std::atomic<std::size_t> peak{0};
  std::atomic<std::size_t> refused{0};
  std::atomic<bool> used{false};  // allocated on, or given a quota
  std::once_flag env_once;        // GPUCLOUD_MEMORY_QUOTA applied at first touch
  std::mutex mutex;
  std::string source;
};

std::array<Account, kMaxGpus + 1>& accounts() {
  static std::array<Account, kMaxGpus + 1> all;
  return all;
}

std::size_t slot_of(Device device) {
  if (device.is_host()) return 0;
  GPUCLOUD_EXPECTS(
      device.index() >= 0 && device.index() < kMaxGpus, "memory_quota",
      "device: " + device.str() + " is beyond the " + std::to_string(kMaxGpus) + " GPUs a memory quota tracks");
  return static_cast<std::size_t>(device.index()) + 1;
}

std::string trim(const std::string& s) {
  const auto b = s.find_first_not_of(" \t");
  const auto e = s.find_last_not_of(" \t");
  return b == std::string::npos ? std::string() : s.substr(b, e - b + 1);
}

std::size_t fraction_of(Device device, double fraction, const std::string& what) {
  GPUCLOUD_EXPECTS(fraction > 0.0 && fraction <= 1.0, "set_memory_fraction",
                   what + ": " + std::to_string(fraction) + " is not in (0, 1]");
  const std::size_t total = memory_info(device).total;
  return static_cast<std::size_t>(std::floor(static_cast<double>(total) * fraction));
}

// An amount of GPUCLOUD_MEMORY_QUOTA: a size, or a fraction ("0.5", "50%") of the device's memory.
std::size_t parse_amount(Device device, const std::string& text, const std::string& what) {
  const std::string t = trim(text);
  if (!t.empty() && t.back() == '%') {
    char* end = nullptr;
    const double percent = std::strtod(t.c_str(), &end);
    GPUCLOUD_EXPECTS(end == t.c_str() + t.size() - 1 && t.size() > 1, "GPUCLOUD_MEMORY_QUOTA",
                     what + ": '" + text + "' is not a percentage");
    return fraction_of(device, percent / 100.0, what);
  }
  if (t.find('.') != std::string::npos && t.find_first_not_of("0123456789.") == std::string::npos) {
    return fraction_of(device, std::strtod(t.c_str(), nullptr), what);
  }
  return parse_bytes(t, what);
}

// GPUCLOUD_MEMORY_QUOTA's amount for @p device: "cuda:N=" over "cuda="/"host=" over a bare one.
void apply_env(Device device, Account& a) {
  const char* env = std::getenv(kMemoryQuotaEnv);
  if (env == nullptr || *env == '\0') return;
  int rank = 0;  // 1: bare, 2: the device's kind, 3: the device itself
  std::stringstream in(env);
  std::string entry;
  while (std::getline(in, entry, ',')) {
    entry = trim(entry);
    if (entry.empty()) continue;
    const auto eq = entry.find('=');
    std::string who = eq == std::string::npos ? std::string() : trim(entry.substr(0, eq));
    const std::string amount = eq == std::string::npos ? entry : entry.substr(eq + 1);
    int r = 1;
    if (!who.empty()) {
      const bool cuda_all = who == "cuda" || who == "gpu";
      const bool host = who == "host" || who == "cpu";
      const bool one =
          who.rfind("cuda:", 0) == 0 && who.size() > 5 && who.find_first_not_of("0123456789", 5) == std::string::npos;
      GPUCLOUD_EXPECTS(cuda_all || host || one, "GPUCLOUD_MEMORY_QUOTA",
                       std::string(kMemoryQuotaEnv) + ": '" + entry + "': the device must be host, cuda or cuda:N");
      if (host) r = device.is_host() ? 2 : 0;
      if (cuda_all) r = device.is_cuda() ? 2 : 0;
      if (one) r = device.is_cuda() && std::stoi(who.substr(5)) == device.index() ? 3 : 0;
    }
    // Every entry is checked, whichever device it names.
    const std::string what = std::string(kMemoryQuotaEnv) + " entry '" + entry + "'";
    const std::size_t bytes = parse_amount(device, amount, what);
    if (r > 0 && r >= rank) {  // the most specific entry; the last of equals
      rank = r;
      a.limit.store(bytes);
    }
  }
  if (rank > 0) a.source = std::string(kMemoryQuotaEnv) + "=" + env;
}

Account& account(Device device) {
  Account& a = accounts()[slot_of(device)];
  std::call_once(a.env_once, [&] {
    std::lock_guard<std::mutex> lock(a.mutex);
    apply_env(device, a);
    if (a.limit.load() != kNoLimit) a.used.store(true);
  });
  return a;
}

void set_limit(Device device, std::size_t bytes, std::string source) {
  Account& a = account(device);
  std::lock_guard<std::mutex> lock(a.mutex);
  a.limit.store(bytes);
  a.source = std::move(source);
  a.used.store(true);
}

MemoryQuota snapshot(Device device, Account& a) {
  MemoryQuota q;
  q.device = device;
  {
    std::lock_guard<std::mutex> lock(a.mutex);
    const std::size_t limit = a.limit.load();
    if (limit != kNoLimit) q.limit_bytes = limit;
    q.source = q.limit_bytes ? a.source : std::string();
  }
  q.held_bytes = a.held.load();
  q.peak_bytes = a.peak.load();
  q.refused = a.refused.load();
  return q;
}

}  // namespace

std::size_t parse_bytes(const std::string& text, const std::string& what) {
  const std::string t = trim(text);
  std::size_t digits = 0;
  while (digits < t.size() && std::isdigit(static_cast<unsigned char>(t[digits]))) ++digits;
  std::string unit = trim(t.substr(digits));
  for (char& c : unit) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  const std::pair<const char*, double> units[] = {
      {"", 1.0},   {"B", 1.0},    {"K", 0x1p10},   {"KIB", 0x1p10}, {"KB", 1e3},   {"M", 0x1p20},   {"MIB", 0x1p20},
      {"MB", 1e6}, {"G", 0x1p30}, {"GIB", 0x1p30}, {"GB", 1e9},     {"T", 0x1p40}, {"TIB", 0x1p40}, {"TB", 1e12},
  };
  for (const auto& [name, scale] : units) {
    if (digits == 0 || unit != name) continue;
    const double value = std::strtod(t.substr(0, digits).c_str(), nullptr) * scale;
    GPUCLOUD_EXPECTS(value < 0x1p63, "parse_bytes", what + ": '" + text + "' is beyond 2^63 bytes");
    return static_cast<std::size_t>(value);
  }
  throw InvalidArgument("parse_bytes",
                        what + ": '" + text +
                            "' is not a size (digits and an optional unit: B, K/KiB, M/MiB, G/GiB, T/TiB "
                            "(powers of 1024), KB, MB, GB, TB (powers of 1000))",
                        __FILE__, __LINE__);
}

void set_memory_quota(Device device, std::size_t bytes) {
  set_limit(device, bytes, "set_memory_quota(" + device.str() + ", " + detail::describe_bytes(bytes) + ")");
}

void set_memory_fraction(Device device, double fraction) {
  const std::size_t bytes = fraction_of(device, fraction, "fraction");
  set_limit(device, bytes, "set_memory_fraction(" + device.str() + ", " + std::to_string(fraction) + ")");
}

void clear_memory_quota(Device device) {
  Account& a = account(device);
  std::lock_guard<std::mutex> lock(a.mutex);
  a.limit.store(kNoLimit);
  a.source.clear();
}

MemoryQuota memory_quota(Device device) { return snapshot(device, account(device)); }

std::vector<MemoryQuota> memory_quotas() {
  std::vector<MemoryQuota> out;
  auto& all = accounts();
  for (std::size_t i = 0; i < all.size(); ++i) {
    if (!all[i].used.load()) continue;
    const Device device = i == 0 ? Device::host() : Device::cuda(static_cast<int>(i) - 1);
    out.push_back(snapshot(device, all[i]));
  }
  return out;
}

namespace detail {

void quota_take(Device device, MemoryKind kind, std::size_t bytes) {
  Account& a = account(device);
  a.used.store(true, std::memory_order_relaxed);
  std::size_t held = a.held.load(std::memory_order_relaxed);
  while (true) {
    const std::size_t limit = a.limit.load(std::memory_order_relaxed);
    if (bytes > limit || held > limit - bytes) {
      a.refused.fetch_add(1, std::memory_order_relaxed);
      std::string source;
      {
        std::lock_guard<std::mutex> lock(a.mutex);
        source = a.source;
      }
      throw OutOfMemory("allocate",
                        "cannot allocate " + describe_bytes(bytes) + " of " + memory_kind_name(kind) + " memory on " +
                            device.str() + ": the process's memory quota there is " + describe_bytes(limit) + " (" +
                            source + ") and " + describe_bytes(held) +
                            " are held; free buffers (pools: release()) or raise the quota",
                        bytes, __FILE__, __LINE__);
    }
    if (a.held.compare_exchange_weak(held, held + bytes, std::memory_order_relaxed)) break;
  }
  std::size_t peak = a.peak.load(std::memory_order_relaxed);
  while (held + bytes > peak && !a.peak.compare_exchange_weak(peak, held + bytes, std::memory_order_relaxed)) {
  }
}

void quota_give(Device device, std::size_t bytes) noexcept {
  if (device.is_cuda() && (device.index() < 0 || device.index() >= kMaxGpus)) return;
  accounts()[device.is_host() ? 0 : static_cast<std::size_t>(device.index()) + 1].held.fetch_sub(
      bytes, std::memory_order_relaxed);
}

}  // namespace detail
}  // namespace gpucloud
