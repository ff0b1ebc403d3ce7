// detail::streaming_copy: byte-identical to memcpy at every size and alignment around its
// thresholds (the line head, the four-page blocks, the line loop and the tail), and never writes
// outside the destination.
#include "runtime/host/streaming_copy.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

namespace d = gpucloud::detail;

TEST(StreamingCopy, EqualsMemcpyAtEverySizeAndAlignmentAroundItsBlocks) {
  constexpr std::size_t kGuard = 256;
  const std::size_t min = d::kStreamingCopyMin, block = 4 * 4096;
  const std::vector<std::size_t> sizes = {0,
                                          1,
                                          63,
                                          min - 1,
                                          min,
                                          min + 1,
                                          min + 63,
                                          min + 64,
                                          min + block - 1,
                                          min + block + 65,
                                          3 * block,
                                          5 * min + 7,
                                          (4u << 20) + 4095};
  std::vector<unsigned char> src(sizes.back() + 2 * kGuard), dst(src.size());
  for (std::size_t i = 0; i < src.size(); ++i) src[i] = static_cast<unsigned char>(i * 131 + 7);
  for (const std::size_t n : sizes) {
    for (const std::size_t dst_offset : {std::size_t{0}, std::size_t{1}, std::size_t{17}, std::size_t{64}}) {
      for (const std::size_t src_offset : {std::size_t{0}, std::size_t{5}, std::size_t{48}}) {
        std::fill(dst.begin(), dst.end(), 0xAB);
        d::streaming_copy(dst.data() + kGuard + dst_offset, src.data() + src_offset, n);
        for (std::size_t i = 0; i < kGuard + dst_offset; ++i) ASSERT_EQ(dst[i], 0xAB) << "n " << n << " before";
        for (std::size_t i = 0; i < n; ++i) {
          ASSERT_EQ(dst[kGuard + dst_offset + i], src[src_offset + i])
              << "n " << n << " dst+" << dst_offset << " src+" << src_offset << " byte " << i;
        }
        for (std::size_t i = kGuard + dst_offset + n; i < dst.size(); ++i)
          ASSERT_EQ(dst[i], 0xAB) << "n " << n << " after";
      }
    }
  }
}
