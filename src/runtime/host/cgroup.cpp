#include "runtime/host/cgroup.hpp"

#include <algorithm>
#include <fstream>
#include <sstream>
#include <vector>

namespace gpucloud::detail {
namespace {

struct Mount {
  std::string root;   // the cgroup path mounted there
  std::string point;  // where it is mounted
  bool v2 = false;
};

bool has_token(const std::string& list, const std::string& token) {
  std::stringstream in(list);
  std::string item;
  while (std::getline(in, item, ',')) {
    if (item == token) return true;
  }
  return false;
}

// The mount of the hierarchy holding @p controller (v1), else the unified (v2) one.
std::optional<Mount> find_mount(const std::string& controller) {
  std::ifstream in("/proc/self/mountinfo");
  std::string line;
  std::optional<Mount> v2;
  while (std::getline(in, line)) {
    // id parent major:minor root mount-point options [optional...] - fstype source super-options
    std::istringstream fields(line);
    std::string id, parent, dev, root, point, options, f;
    fields >> id >> parent >> dev >> root >> point >> options;
    while (fields >> f && f != "-") {
    }
    std::string fstype, source, super;
    fields >> fstype >> source >> super;
    if (fstype == "cgroup" && has_token(super, controller)) return Mount{root, point, false};
    if (fstype == "cgroup2" && !v2) v2 = Mount{root, point, true};
  }
  return v2;
}

// The process's path in the hierarchy of @p controller (v1) or the unified one (v2).
std::optional<std::string> cgroup_path(const std::string& controller, bool v2) {
  std::ifstream in("/proc/self/cgroup");
  std::string line;
  while (std::getline(in, line)) {
    const auto a = line.find(':');
    const auto b = a == std::string::npos ? a : line.find(':', a + 1);
    if (b == std::string::npos) continue;
    const std::string controllers = line.substr(a + 1, b - a - 1);
    if (v2 ? (line.compare(0, a, "0") == 0 && controllers.empty()) : has_token(controllers, controller))
      return line.substr(b + 1);
  }
  return std::nullopt;
}

// The directories from the process's cgroup up to the mount point, innermost first.
std::vector<std::string> cgroup_dirs(const std::string& controller, bool* v2) {
  const std::optional<Mount> mount = find_mount(controller);
  if (!mount) return {};
  *v2 = mount->v2;
  std::string path = cgroup_path(controller, mount->v2).value_or("/");
  // Inside a cgroup namespace the path is relative to the mount's root already; outside, strip it.
  if (mount->root != "/" && path.compare(0, mount->root.size(), mount->root) == 0) path.erase(0, mount->root.size());
  std::vector<std::string> dirs;
  while (true) {
    dirs.push_back(mount->point + (path == "/" ? "" : path));
    if (path.empty() || path == "/") break;
    const auto slash = path.find_last_of('/');
    path = slash == 0 || slash == std::string::npos ? "/" : path.substr(0, slash);
  }
  return dirs;
}

std::optional<std::string> read_word(const std::string& file) {
  std::ifstream in(file);
  std::string word;
  if (!(in >> word)) return std::nullopt;
  return word;
}

std::optional<std::size_t> read_bytes(const std::string& file) {
  const auto word = read_word(file);
  if (!word || *word == "max") return std::nullopt;
  try {
    const unsigned long long v = std::stoull(*word);
    if (v >= (1ULL << 62)) return std::nullopt;  // v1's "unlimited" (PAGE_COUNTER_MAX pages)
    return static_cast<std::size_t>(v);
  } catch (...) {
    return std::nullopt;
  }
}

}  // namespace

CgroupMemory cgroup_memory() {
  CgroupMemory out;
  bool v2 = false;
  for (const std::string& dir : cgroup_dirs("memory", &v2)) {
    const auto limit = read_bytes(dir + (v2 ? "/memory.max" : "/memory.limit_in_bytes"));
    if (limit && (!out.limit || *limit < *out.limit)) {
      out.limit = limit;
      out.usage = read_bytes(dir + (v2 ? "/memory.current" : "/memory.usage_in_bytes"));
      out.path = dir;
    }
  }
  return out;
}

std::optional<double> cgroup_cpu_limit() {
  std::optional<double> out;
  bool v2 = false;
  for (const std::string& dir : cgroup_dirs("cpu", &v2)) {
    double quota = -1, period = 0;
    if (v2) {
      std::ifstream in(dir + "/cpu.max");
      std::string q;
      if (!(in >> q >> period) || q == "max") continue;
      try {
        quota = std::stod(q);
      } catch (...) {
        continue;
      }
    } else {
      std::ifstream q(dir + "/cpu.cfs_quota_us"), p(dir + "/cpu.cfs_period_us");
      if (!(q >> quota) || !(p >> period)) continue;
    }
    if (quota <= 0 || period <= 0) continue;
    const double cpus = quota / period;
    if (!out || cpus < *out) out = cpus;
  }
  return out;
}

}  // namespace gpucloud::detail
