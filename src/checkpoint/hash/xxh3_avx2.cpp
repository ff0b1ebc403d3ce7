// XXH3-64 built for AVX2 (this file alone gets -mavx2): the checksum of every checkpoint tensor,
// chosen at run time by checkpoint/format.cpp when the CPU has AVX2 but not AVX-512.
#define XXH_INLINE_ALL
#include <xxhash.h>

#include <cstddef>
#include <cstdint>

#include "xxh3_copy.inc"

namespace gpucloud::checkpoint::detail {
using CopyFn = void (*)(void*, const void*, std::size_t) noexcept;
std::uint64_t xxh3_avx2(const void* data, std::size_t n) noexcept { return XXH3_64bits(data, n); }
std::uint64_t xxh3_copy_avx2(void* dst, const void* src, std::size_t n, CopyFn copy) noexcept {
  return xxh3_copy_pieces(dst, src, n, copy);
}
}  // namespace gpucloud::checkpoint::detail
