#include "checkpoint/format.hpp"

#include "checkpoint/files.hpp"
#include "runtime/host/streaming_copy.hpp"

#include <gpucloud/runtime/error.hpp>

#include <nlohmann/json.hpp>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include <array>
#include <cstdio>
#include <limits>

namespace gpucloud::checkpoint::detail {

using nlohmann::json;

#include "checkpoint/hash/xxh3_copy.inc"

#if defined(GPUCLOUD_XXH3_X86)
// The same XXH3-64 in wider vectors (checkpoint/hash/): identical results, 1.3-1.7x the baseline
// SSE2 build's bytes per second on one core.
using CopyFn = void (*)(void*, const void*, std::size_t) noexcept;
std::uint64_t xxh3_avx512(const void* data, std::size_t n) noexcept;
std::uint64_t xxh3_avx2(const void* data, std::size_t n) noexcept;
std::uint64_t xxh3_copy_avx512(void* dst, const void* src, std::size_t n, CopyFn copy) noexcept;
std::uint64_t xxh3_copy_avx2(void* dst, const void* src, std::size_t n, CopyFn copy) noexcept;
namespace {
using Xxh3Fn = std::uint64_t (*)(const void*, std::size_t) noexcept;
using Xxh3CopyFn = std::uint64_t (*)(void*, const void*, std::size_t, CopyFn) noexcept;
std::uint64_t xxh3_baseline(const void* data, std::size_t n) noexcept { return XXH3_64bits(data, n); }
int isa() noexcept {  // 2: AVX-512, 1: AVX2, 0: the baseline
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f")) return 2;
  if (__builtin_cpu_supports("avx2")) return 1;
  return 0;
}
}  // namespace
std::uint64_t xxh3(const void* data, std::size_t n) noexcept {
  static const Xxh3Fn fn = std::array<Xxh3Fn, 3>{xxh3_baseline, xxh3_avx2, xxh3_avx512}[isa()];
  return fn(data, n);
}
std::uint64_t xxh3_copy(void* dst, const void* src, std::size_t n) noexcept {
  static const Xxh3CopyFn fn = std::array<Xxh3CopyFn, 3>{xxh3_copy_pieces, xxh3_copy_avx2, xxh3_copy_avx512}[isa()];
  return fn(dst, src, n, gpucloud::detail::streaming_copy);
}
#else
std::uint64_t xxh3(const void* data, std::size_t n) noexcept { return XXH3_64bits(data, n); }
std::uint64_t xxh3_copy(void* dst, const void* src, std::size_t n) noexcept {
  return xxh3_copy_pieces(dst, src, n, gpucloud::detail::streaming_copy);
}
#endif

std::string hex64(std::uint64_t v) {
  char text[17];
  std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(v));
  return text;
}

namespace {
bool parse_hex64(const std::string& s, std::uint64_t& out) {
  if (s.size() != 16) return false;
  std::uint64_t v = 0;
  for (char c : s) {
    int d = 0;
    if (c >= '0' && c <= '9') {
      d = c - '0';
    } else if (c >= 'a' && c <= 'f') {
      d = c - 'a' + 10;
    } else {
      return false;
    }
    v = v << 4 | static_cast<std::uint64_t>(d);
  }
  out = v;
  return true;
}

struct DTypeName {
  DType dtype;
  const char* name;
};
constexpr DTypeName kNames[] = {
    {DType::float32, "F32"},   {DType::float64, "F64"},         {DType::float16, "F16"},
    {DType::bfloat16, "BF16"}, {DType::int32, "I32"},           {DType::int64, "I64"},
    {DType::uint8, "U8"},      {DType::float8_e4m3, "F8_E4M3"}, {DType::float8_e5m2, "F8_E5M2"}};

[[noreturn]] void corrupt(const std::string& file, const std::string& what) {
  throw CheckpointError("checkpoint", file + ": " + what, __FILE__, __LINE__);
}

std::vector<std::int64_t> shape_from(const json& j, const std::string& file, const std::string& name) {
  if (!j.is_array()) corrupt(file, "tensor '" + name + "': shape is not a list");
  if (j.size() > kMaxRank) {
    corrupt(file, "tensor '" + name + "': " + std::to_string(j.size()) + " dimensions, more than the " +
                      std::to_string(kMaxRank) + " a tensor can have");
  }
  std::vector<std::int64_t> shape;
  for (const auto& d : j) {
    if (!d.is_number_integer() || d.get<std::int64_t>() < 0) {
      corrupt(file, "tensor '" + name + "': shape has a dimension that is not a non-negative integer");
    }
    shape.push_back(d.get<std::int64_t>());
  }
  return shape;
}

std::uint64_t offset_from(const json& j, const std::string& file, const std::string& name) {
  if (!j.is_number_unsigned() && !(j.is_number_integer() && j.get<std::int64_t>() >= 0)) {
    corrupt(file, "tensor '" + name + "': a byte offset is not a non-negative integer");
  }
  return j.get<std::uint64_t>();
}

// Elements of @p shape, or false when the product overflows 2^63.
bool checked_count(const std::vector<std::int64_t>& shape, std::uint64_t& out) {
  std::uint64_t n = 1;
  for (auto d : shape) {
    const auto u = static_cast<std::uint64_t>(d);
    if (u != 0 && n > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()) / u) return false;
    n *= u;
  }
  out = n;
  return true;
}

// Checks that @p e's byte range holds exactly its shape's elements.
void check_extent(const FileEntry& e, const std::string& file, const std::string& name) {
  std::uint64_t n = 0;
  if (!checked_count(e.shape, n) || n > std::numeric_limits<std::uint64_t>::max() / 8) {
    corrupt(file, "tensor '" + name + "': shape " + shape_str(e.shape) + " overflows");
  }
  if (e.end < e.begin || e.end - e.begin != n * dtype_size(e.dtype)) {
    corrupt(file, "tensor '" + name + "': bytes [" + std::to_string(e.begin) + ", " + std::to_string(e.end) +
                      ") do not hold " + shape_str(e.shape) + " elements of " + dtype_name(e.dtype));
  }
}
}  // namespace

void check_json_depth(const std::string& text, const std::string& file) {
  int depth = 0;
  bool in_string = false;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > kMaxJsonDepth) {
        corrupt(file, "JSON nested deeper than " + std::to_string(kMaxJsonDepth) + " levels at byte " +
                          std::to_string(i) + " (refused before parsing: not a file this library wrote)");
      }
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
}

bool step_of_directory_name(const std::string& name, std::int64_t& step) {
  // "step-" and 12 to 19 digits: directory_name pads to 12 and an int64 has at most 19.
  if (name.size() < 17 || name.size() > 24 || name.compare(0, 5, "step-") != 0) return false;
  std::uint64_t v = 0;
  for (std::size_t i = 5; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return false;
    v = v * 10 + static_cast<std::uint64_t>(name[i] - '0');  // 19 digits fit in 64 bits
  }
  if (v > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) return false;
  const auto s = static_cast<std::int64_t>(v);
  if (directory_name(s) != name) return false;  // one name per step: no extra leading zeros
  step = s;
  return true;
}

const char* safetensors_dtype(DType t) noexcept {
  for (const auto& n : kNames) {
    if (n.dtype == t) return n.name;
  }
  return "?";
}

bool dtype_from_safetensors(const std::string& name, DType& out) noexcept {
  for (const auto& n : kNames) {
    if (name == n.name) {
      out = n.dtype;
      return true;
    }
  }
  return false;
}

std::uint64_t element_count(const std::vector<std::int64_t>& shape) noexcept {
  std::uint64_t n = 1;
  for (auto d : shape) n *= static_cast<std::uint64_t>(d);
  return n;
}

std::string shape_str(const std::vector<std::int64_t>& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

std::string safetensors_prefix(const std::map<std::string, FileEntry>& entries, const Metadata& metadata) {
  json header = json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  for (const auto& [name, e] : entries) {
    header[name] = {{"dtype", safetensors_dtype(e.dtype)}, {"shape", e.shape}, {"data_offsets", {e.begin, e.end}}};
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  std::string prefix(8, '\0');
  std::uint64_t n = text.size();
  for (int i = 0; i < 8; ++i) prefix[static_cast<std::size_t>(i)] = static_cast<char>((n >> (8 * i)) & 0xff);
  return prefix + text;
}

std::map<std::string, FileEntry> parse_safetensors_header(const std::string& text, const std::string& file) {
  check_json_depth(text, file);
  json header;
  try {
    header = json::parse(text);
  } catch (const json::exception& e) {
    corrupt(file, std::string("the safetensors header is not JSON (") + e.what() + ")");
  }
  if (!header.is_object()) corrupt(file, "the safetensors header is not a JSON object");
  std::map<std::string, FileEntry> entries;
  for (const auto& [name, j] : header.items()) {
    if (name == "__metadata__") continue;
    if (!j.is_object() || !j.contains("dtype") || !j.contains("shape") || !j.contains("data_offsets")) {
      corrupt(file, "tensor '" + name + "': needs dtype, shape and data_offsets");
    }
    FileEntry e;
    if (!j["dtype"].is_string() || !dtype_from_safetensors(j["dtype"].get<std::string>(), e.dtype)) {
      corrupt(file, "tensor '" + name + "': unknown dtype " + j["dtype"].dump());
    }
    e.shape = shape_from(j["shape"], file, name);
    const json& off = j["data_offsets"];
    if (!off.is_array() || off.size() != 2) corrupt(file, "tensor '" + name + "': data_offsets is not [begin, end]");
    e.begin = offset_from(off[0], file, name);
    e.end = offset_from(off[1], file, name);
    check_extent(e, file, name);
    entries.emplace(name, std::move(e));
  }
  return entries;
}

std::string encode_manifest(const Manifest& m) {
  json tensors = json::object();
  for (const auto& [name, t] : m.tensors) {
    tensors[name] = {{"dtype", safetensors_dtype(t.dtype)},
                     {"shape", t.shape},
                     {"file", t.file},
                     {"byte_range", {t.begin, t.end}},
                     {"xxh3_64", hex64(t.xxh3)}};
  }
  const json body = {{"format", "gpucloud-checkpoint"},
                     {"format_version", m.format_version},
                     {"step", m.step},
                     {"world_size", m.world_size},
                     {"files", m.files},
                     {"tensors", tensors},
                     {"metadata", m.metadata}};
  const std::string canonical = body.dump();
  const json whole = {{"body", body}, {"xxh3_64", hex64(xxh3(canonical.data(), canonical.size()))}};
  return whole.dump(1) + "\n";
}

Manifest decode_manifest(const std::string& text, const std::string& path) {
  check_json_depth(text, path);
  json whole;
  try {
    whole = json::parse(text);
  } catch (const json::exception& e) {
    corrupt(path, std::string("not JSON (") + e.what() + ")");
  }
  if (!whole.is_object() || !whole.contains("body") || !whole.contains("xxh3_64") || !whole["xxh3_64"].is_string()) {
    corrupt(path, "not a gpucloud manifest (needs body and xxh3_64)");
  }
  const json& body = whole["body"];
  std::uint64_t want = 0;
  if (!parse_hex64(whole["xxh3_64"].get<std::string>(), want)) corrupt(path, "xxh3_64 is not 16 hex digits");
  const std::string canonical = body.dump();
  if (xxh3(canonical.data(), canonical.size()) != want) {
    corrupt(path, "checksum mismatch: the manifest was changed or damaged after it was written");
  }
  try {
    if (body.at("format").get<std::string>() != "gpucloud-checkpoint") corrupt(path, "not a gpucloud checkpoint");
    Manifest m;
    m.format_version = body.at("format_version").get<int>();
    if (m.format_version < 1 || m.format_version > kFormatVersion) {
      corrupt(path, "format version " + std::to_string(m.format_version) + ": this gpucloud reads versions 1 to " +
                        std::to_string(kFormatVersion));
    }
    m.step = body.at("step").get<std::int64_t>();
    m.world_size = body.at("world_size").get<int>();
    m.files = body.at("files").get<std::vector<std::string>>();
    m.metadata = body.at("metadata").get<Metadata>();
    if (m.step < 0 || m.world_size < 1) corrupt(path, "a negative step or a world size below 1");
    for (const auto& f : m.files) {
      if (f.empty() || f.find('/') != std::string::npos || f == "." || f == "..") {
        corrupt(path, "file name '" + f + "' is not a plain name inside the checkpoint");
      }
    }
    for (const auto& [name, j] : body.at("tensors").items()) {
      TensorInfo t;
      if (!dtype_from_safetensors(j.at("dtype").get<std::string>(), t.dtype)) {
        corrupt(path, "tensor '" + name + "': unknown dtype");
      }
      t.shape = shape_from(j.at("shape"), path, name);
      t.file = j.at("file").get<std::string>();
      bool listed = false;
      for (const auto& f : m.files) listed = listed || f == t.file;
      if (!listed) corrupt(path, "tensor '" + name + "': its file '" + t.file + "' is not among the files");
      const json& range = j.at("byte_range");
      if (!range.is_array() || range.size() != 2)
        corrupt(path, "tensor '" + name + "': byte_range is not [begin, end]");
      t.begin = offset_from(range[0], path, name);
      t.end = offset_from(range[1], path, name);
      check_extent(FileEntry{t.dtype, t.shape, t.begin, t.end}, path, name);
      if (!parse_hex64(j.at("xxh3_64").get<std::string>(), t.xxh3)) corrupt(path, "tensor '" + name + "': bad xxh3_64");
      m.tensors.emplace(name, std::move(t));
    }
    m.directory = parent_of(path);
    return m;
  } catch (const json::exception& e) {
    corrupt(path, std::string("a field is missing or of the wrong type (") + e.what() + ")");
  }
}

}  // namespace gpucloud::checkpoint::detail
