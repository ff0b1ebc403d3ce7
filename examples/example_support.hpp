// What the training examples share: a counter-based normal generator (the same number for the same
// (seed, a, b, c) on every rank and after a restart), and float values into and out of buffers of
// any float dtype on any device, and the device figures of the progress lines.
#pragma once

#include <gpucloud/gpucloud.hpp>

#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <limits>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

namespace examples {

namespace gc = gpucloud;

/// The device's load for a progress line: "util  37%  mem  1.23 GiB" ("-" where not reported).
inline std::string brief(const gc::DeviceMetrics& m) {
  char text[64];
  if (m.utilization) {
    std::snprintf(text, sizeof text, "util %3.0f%%  mem %5.2f GiB", *m.utilization,
                  static_cast<double>(m.memory_used) / 1073741824.0);
  } else {
    std::snprintf(text, sizeof text, "util    -  mem %5.2f GiB", static_cast<double>(m.memory_used) / 1073741824.0);
  }
  return text;
}

/// The run's device figures for the final summary (what nvidia-smi would have shown meanwhile),
/// with the energy per sample when the device reports energy and @p samples (this process's) > 0.
inline std::string describe(const gc::MetricsSummary& s, double samples = 0) {
  char text[384];
  int n = std::snprintf(text, sizeof text, "device %s: %zu readings over %.1f s", s.device.str().c_str(), s.samples,
                        s.seconds);
  auto more = [&](const char* fmt, auto... args) {
    if (n >= 0 && static_cast<std::size_t>(n) < sizeof text)
      n += std::snprintf(text + n, sizeof text - n, fmt, args...);
  };
  if (s.utilization.count > 0) more(", util mean %.0f%% max %.0f%%", s.utilization.mean, s.utilization.max);
  more(", memory peak %.2f GiB", s.memory_used.max / 1073741824.0);
  if (s.temperature_c.count > 0) more(", temperature max %.0f C", s.temperature_c.max);
  if (s.power_w.count > 0) more(", power mean %.0f W", s.power_w.mean);
  if (s.energy_j) more(", energy %.0f J", *s.energy_j);
  if (s.energy_j && samples > 0) more(" (%.3g J/sample)", *s.energy_j / samples);
  if (!s.energy_j) more(", energy not measured (no power sensor or energy counter)");
  return text;
}

/// How an option's value is stored into its field; throws std::invalid_argument saying what the
/// value should be (parse_options names the option).
using Setter = std::function<void(const std::string&)>;
inline Setter into(int& v) {
  return [&v](const std::string& s) {
    char* end = nullptr;
    errno = 0;
    const long x = std::strtol(s.c_str(), &end, 10);
    if (s.empty() || *end != '\0' || errno == ERANGE || x < INT_MIN || x > INT_MAX) {
      throw std::invalid_argument("'" + s + "' is not an integer");
    }
    v = static_cast<int>(x);
  };
}
inline Setter into(double& v) {
  return [&v](const std::string& s) {
    char* end = nullptr;
    const double x = std::strtod(s.c_str(), &end);
    if (s.empty() || *end != '\0' || !std::isfinite(x))
      throw std::invalid_argument("'" + s + "' is not a finite number");
    v = x;
  };
}
inline Setter into(float& v) {
  return [&v](const std::string& s) {
    double x = 0;
    into(x)(s);
    if (std::fabs(x) > std::numeric_limits<float>::max()) throw std::invalid_argument("'" + s + "' overflows a float");
    v = static_cast<float>(x);
  };
}
inline Setter into(std::string& v) {
  return [&v](const std::string& s) { v = s; };
}

/// Reads "--name value" options (and value-less @p switches) into their fields; an unknown option,
/// a missing value or a value of the wrong form is an InvalidArgument naming the option.
inline void parse_options(int argc, char** argv, const char* program, const std::map<std::string, Setter>& options,
                          const std::map<std::string, bool*>& switches = {}) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (auto sw = switches.find(a); sw != switches.end()) {
      *sw->second = true;
      continue;
    }
    auto opt = options.find(a);
    if (opt == options.end()) throw gc::InvalidArgument(program, "unknown option " + a, __FILE__, __LINE__);
    if (i + 1 >= argc) throw gc::InvalidArgument(program, a + ": needs a value", __FILE__, __LINE__);
    try {
      opt->second(argv[++i]);
    } catch (const std::exception& e) {
      throw gc::InvalidArgument(program, a + ": " + e.what(), __FILE__, __LINE__);
    }
  }
}

/// An option's value checked after parsing: @throws InvalidArgument "option: why" unless @p ok.
inline void require(bool ok, const char* program, const std::string& option, const std::string& why) {
  if (!ok) throw gc::InvalidArgument(program, option + ": " + why, __FILE__, __LINE__);
}

/// @p value is one of @p allowed, or an InvalidArgument naming @p option and the choices.
inline void require_one_of(const std::string& value, std::initializer_list<const char*> allowed, const char* program,
                           const std::string& option) {
  std::string list;
  for (const char* a : allowed) {
    if (value == a) return;
    list += (list.empty() ? "" : ", ") + std::string(a);
  }
  require(false, program, option, "'" + value + "' is not one of " + list);
}

/// splitmix64's finaliser: a well-mixed 64-bit value from @p z.
inline std::uint64_t mix64(std::uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/// 64 random bits that are a pure function of (seed, a, b, c).
inline std::uint64_t hash4(std::uint64_t seed, std::uint64_t a, std::uint64_t b, std::uint64_t c) {
  return mix64(seed ^ mix64(a ^ mix64(b ^ mix64(c))));
}

/// A standard normal number that is a pure function of (seed, a, b, c).
inline double normal(std::uint64_t seed, std::uint64_t a, std::uint64_t b, std::uint64_t c) {
  const std::uint64_t h = hash4(seed, a, b, c);
  const double u1 = (static_cast<double>(h >> 11) + 0.5) / 9007199254740992.0;
  const double u2 = (static_cast<double>(mix64(h) >> 11) + 0.5) / 9007199254740992.0;
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}

/// Two independent standard normals from one hash of (@p seed, @p a, @p b, @p c): Box-Muller's
/// both outputs, in float (a data loader's rate: half the hashing and logarithms of two normal()s).
inline void normal_pair(std::uint64_t seed, std::uint64_t a, std::uint64_t b, std::uint64_t c, float& x0, float& x1) {
  const std::uint64_t h = hash4(seed, a, b, c);
  const float u1 = (static_cast<float>(h >> 40) + 0.5f) / 16777216.0f;  // (0, 1): 24 bits
  const float u2 = static_cast<float>((h >> 16) & 0xffffffu) / 16777216.0f;
  const float r = std::sqrt(-2.0f * std::log(u1)), theta = 6.2831853f * u2;
  x0 = r * std::cos(theta);
  x1 = r * std::sin(theta);
}

/// The values of @p view as floats (synchronises @p s).
inline std::vector<float> read_floats(gc::BufferView view, gc::StreamView s) {
  gc::Buffer f(view.size(), gc::DType::float32, view.device()),
      host(view.size(), gc::DType::float32, gc::Device::host(), gc::MemoryKind::pinned);
  gc::cast(f, view, s);
  gc::copy(host, f, s);
  s.synchronize();
  return std::vector<float>(host.data_as<float>(), host.data_as<float>() + view.size());
}

/// @p v rounded into @p dst's dtype (synchronises @p s).
inline void write_floats(gc::BufferView dst, const std::vector<float>& v, gc::StreamView s) {
  gc::Buffer host(v.size(), gc::DType::float32, gc::Device::host(), gc::MemoryKind::pinned),
      f(v.size(), gc::DType::float32, dst.device());
  std::memcpy(host.data(), v.data(), v.size() * 4);
  gc::copy(f, host, s);
  gc::cast(dst, f, s);
  s.synchronize();
}

/// Stores @p v into element @p i of a host buffer of dtype float32, float16 or bfloat16.
inline void store(gc::BufferView host, std::size_t i, float v) {
  if (host.dtype() == gc::DType::float16)
    host.data_as<gc::Half>()[i] = gc::Half(v);
  else if (host.dtype() == gc::DType::bfloat16)
    host.data_as<gc::BFloat16>()[i] = gc::BFloat16(v);
  else
    host.data_as<float>()[i] = v;
}

}  // namespace examples
