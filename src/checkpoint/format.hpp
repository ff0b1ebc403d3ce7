// The bytes of a checkpoint: safetensors headers, the manifest, checksums (docs/checkpoint.md).
#pragma once

#include <gpucloud/checkpoint/checkpoint.hpp>

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace gpucloud::checkpoint::detail {

/// XXH3-64 of @p n bytes (xxHash, from libxxhash-dev).
std::uint64_t xxh3(const void* data, std::size_t n) noexcept;
/// Copies @p n bytes from @p src to @p dst (not overlapping) and returns their XXH3-64, hashing each
/// piece while it is in the cache: one read of @p src where xxh3() then a copy read it twice.
std::uint64_t xxh3_copy(void* dst, const void* src, std::size_t n) noexcept;
/// 16 lowercase hex digits.
std::string hex64(std::uint64_t v);

/// safetensors' name of @p t ("F32", "BF16", "F8_E4M3", ...).
const char* safetensors_dtype(DType t) noexcept;
/// The DType of a safetensors name; false when gpucloud has none.
bool dtype_from_safetensors(const std::string& name, DType& out) noexcept;

/// One tensor of a safetensors file: offsets relative to the start of the data.
struct FileEntry {
  DType dtype = DType::float32;
  std::vector<std::int64_t> shape;
  std::uint64_t begin = 0, end = 0;
};

/// Deepest nesting of arrays and objects a reader accepts in any JSON it parses (a manifest
/// needs 5 levels): checked on the raw text before parsing, which recurses.
inline constexpr int kMaxJsonDepth = 16;
/// Largest manifest a reader accepts.
inline constexpr std::uint64_t kMaxManifestBytes = 256u << 20;
/// Most dimensions of a tensor.
inline constexpr std::size_t kMaxRank = 64;

/// @throws CheckpointError naming @p file when @p text nests arrays/objects deeper than
///         kMaxJsonDepth (strings skipped); nothing else is judged.
void check_json_depth(const std::string& text, const std::string& file);

/// The step of a committed checkpoint's directory name (exactly directory_name(step)); false for
/// anything else (temporary, superseded or foreign names).
bool step_of_directory_name(const std::string& name, std::int64_t& step);

/// Largest header a reader accepts (safetensors' own limit is 100 MB).
inline constexpr std::uint64_t kMaxHeaderBytes = 100u << 20;

/// A safetensors header for @p entries (padded with spaces to a multiple of 8 bytes, as the
/// reference writer does), preceded by its 8-byte little-endian length: the file's first bytes.
std::string safetensors_prefix(const std::map<std::string, FileEntry>& entries, const Metadata& metadata);

/// Parses a safetensors header (the JSON text) of @p file. @throws CheckpointError naming @p file.
std::map<std::string, FileEntry> parse_safetensors_header(const std::string& json, const std::string& file);

/// The manifest's text: its body and the XXH3-64 of the body's canonical form.
std::string encode_manifest(const Manifest& m);
/// Parses and verifies a manifest read from @p path. @throws CheckpointError naming @p path.
Manifest decode_manifest(const std::string& text, const std::string& path);

/// Elements of @p shape (no overflow: the caller checked the shape against a size or a file).
std::uint64_t element_count(const std::vector<std::int64_t>& shape) noexcept;
/// "[2, 3]".
std::string shape_str(const std::vector<std::int64_t>& shape);

}  // namespace gpucloud::checkpoint::detail
