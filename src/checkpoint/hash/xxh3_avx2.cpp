// XXH3-64 built for AVX2 (this file alone gets -mavx2): the checksum of every checkpoint tensor,
// chosen at run time by checkpoint/format.cpp when the CPU has AVX2 but not AVX-512.
#define XXH_INLINE_ALL
#include <xxhash.h>

#include <cstddef>
#include <cstdint>

namespace gpucloud::checkpoint::detail {
std::uint64_t xxh3_avx2(const void* data, std::size_t n) noexcept { return XXH3_64bits(data, n); }
}  // namespace gpucloud::checkpoint::detail
