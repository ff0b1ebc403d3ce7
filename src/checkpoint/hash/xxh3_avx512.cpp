// XXH3-64 built for AVX-512 (this file alone gets -mavx512f): the checksum of every checkpoint
// tensor, chosen at run time by checkpoint/format.cpp when the CPU has AVX-512.
#define XXH_INLINE_ALL
#include <xxhash.h>

#include <cstddef>
#include <cstdint>

#include "xxh3_copy.inc"

namespace gpucloud::checkpoint::detail {
using CopyFn = void (*)(void*, const void*, std::size_t) noexcept;
std::uint64_t xxh3_avx512(const void* data, std::size_t n) noexcept { return XXH3_64bits(data, n); }
std::uint64_t xxh3_copy_avx512(void* dst, const void* src, std::size_t n, CopyFn copy) noexcept {
  return xxh3_copy_pieces(dst, src, n, copy);
}
}  // namespace gpucloud::checkpoint::detail
