#include "runtime/host/streaming_copy.hpp"

#include <cstdint>
#include <cstring>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace gpucloud::detail {

#if defined(__SSE2__)
namespace {
constexpr std::size_t kLine = 64, kPage = 4096, kPages = 4;

inline void copy_line(char* d, const char* s) noexcept {
  const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s));
  const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 16));
  const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 32));
  const __m128i e = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 48));
  _mm_stream_si128(reinterpret_cast<__m128i*>(d), a);
  _mm_stream_si128(reinterpret_cast<__m128i*>(d + 16), b);
  _mm_stream_si128(reinterpret_cast<__m128i*>(d + 32), c);
  _mm_stream_si128(reinterpret_cast<__m128i*>(d + 48), e);
}
}  // namespace

void streaming_copy(void* dst, const void* src, std::size_t n) noexcept {
  auto* d = static_cast<char*>(dst);
  const auto* s = static_cast<const char*>(src);
  if (n < kStreamingCopyMin) {
    std::memcpy(d, s, n);
    return;
  }
  // Up to the destination's next cache line with memcpy; then whole lines, four pages at a time
  // read side by side (each page's stream of lines stays in one DRAM page), then the tail.
  const std::size_t head = (kLine - (reinterpret_cast<std::uintptr_t>(d) & (kLine - 1))) & (kLine - 1);
  std::memcpy(d, s, head);
  d += head;
  s += head;
  n -= head;
  std::size_t i = 0;
  for (; i + kPages * kPage <= n; i += kPages * kPage) {
    for (std::size_t o = 0; o < kPage; o += kLine) {
      for (std::size_t p = 0; p < kPages; ++p) {
        _mm_prefetch(s + i + p * kPage + o + 4 * kLine, _MM_HINT_T0);
        copy_line(d + i + p * kPage + o, s + i + p * kPage + o);
      }
    }
  }
  for (; i + kLine <= n; i += kLine) copy_line(d + i, s + i);
  _mm_sfence();  // the streamed lines are visible before anyone is told the copy is done
  std::memcpy(d + i, s + i, n - i);
}
#else
void streaming_copy(void* dst, const void* src, std::size_t n) noexcept { std::memcpy(dst, src, n); }
#endif

}  // namespace gpucloud::detail
