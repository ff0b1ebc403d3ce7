// XXH3-64 built for AVX-512 (this file alone gets -mavx512f): the checksum of every checkpoint
// tensor, chosen at run time by checkpoint/format.cpp when the CPU has AVX-512.
#define XXH_INLINE_ALL
#include <xxhash.h>

#include <cstddef>
#include <cstdint>

namespace gpucloud::checkpoint::detail {
std::uint64_t xxh3_avx512(const void* data, std::size_t n) noexcept { return XXH3_64bits(data, n); }
}  // namespace gpucloud::checkpoint::detail
