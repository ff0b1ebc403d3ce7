// fp32 <-> fp16 arrays in the CPU's conversion instructions (AVX-512F's 16-lane vcvtps2ph /
// vcvtph2ps, or F16C's 8-lane ones with AVX2), chosen once at run time; the branch-free scalar
// conversions of kernels/compute/host_convert.hpp elsewhere. Bit for bit the same results: the
// instructions round to nearest even as the reference does; the two places they differ are fixed
// up (a NaN narrows to 0x7fff as CUDA's __float2half_rn gives, where the instruction keeps the
// payload; a signalling NaN widens still signalling, where the instruction quiets it).
// Every vector version clears the upper halves of the vector registers (vzeroupper) before its
// scalar tail and before it returns: GCC leaves them dirty across a tail call, and a caller's
// SSE code after dirty AVX-512 state runs many times slower (libm's sinf 20x in train_mlp's loader).
#include "kernels/compute/host_convert.hpp"

#include <cstdint>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define GPUCLOUD_F16_X86 1
#endif

namespace gpucloud::kernels::host {

namespace {

void narrow_scalar(std::uint16_t* dst, const float* src, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) {
    std::uint32_t b;
    std::memcpy(&b, &src[i], sizeof b);
    dst[i] = to_half_bits(b);
  }
}

void widen_scalar(float* dst, const std::uint16_t* src, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint32_t b = from_half_bits(src[i]);
    std::memcpy(&dst[i], &b, sizeof b);
  }
}

// x[i] = x[i] * factor through fp32, rounded once; true when an x[i] was inf or NaN.
bool scale_half_scalar(std::uint16_t* x, std::size_t n, float factor) {
  bool bad = false;
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint32_t b = from_half_bits(x[i]);
    bad |= (b & 0x7f800000u) == 0x7f800000u;
    float v;
    std::memcpy(&v, &b, sizeof v);
    v *= factor;
    std::uint32_t r;
    std::memcpy(&r, &v, sizeof r);
    x[i] = to_half_bits(r);
  }
  return bad;
}

bool scale_bf16_scalar(std::uint16_t* x, std::size_t n, float factor) {
  bool bad = false;
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint32_t b = static_cast<std::uint32_t>(x[i]) << 16;
    bad |= (b & 0x7f800000u) == 0x7f800000u;
    float v;
    std::memcpy(&v, &b, sizeof v);
    v *= factor;
    std::uint32_t r;
    std::memcpy(&r, &v, sizeof r);
    x[i] = to_bfloat16_bits(r);
  }
  return bad;
}

#if defined(GPUCLOUD_F16_X86)
constexpr int kRound = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
constexpr std::int32_t kNanAsHalf7fff = 0x7fffe000;  // a float NaN whose top mantissa bits make 0x7fff

__attribute__((target("avx512f"))) void narrow_avx512(std::uint16_t* dst, const float* src, std::size_t n) {
  const __m512 nan = _mm512_castsi512_ps(_mm512_set1_epi32(kNanAsHalf7fff));
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m512 v = _mm512_loadu_ps(src + i);
    v = _mm512_mask_mov_ps(v, _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), nan);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), _mm512_cvtps_ph(v, kRound));
  }
  _mm256_zeroupper();
  narrow_scalar(dst + i, src + i, n - i);
}

// Lanes whose half is a signalling NaN (exponent all ones, quiet bit clear, payload not zero)
// get the float's quiet bit (bit 22) cleared again.
__attribute__((target("avx512f"))) void widen_avx512(float* dst, const std::uint16_t* src, std::size_t n) {
  const __m256i exp_quiet = _mm256_set1_epi16(0x7e00), signalling = _mm256_set1_epi16(0x7c00);
  const __m256i payload = _mm256_set1_epi16(0x01ff), zero = _mm256_setzero_si256();
  const __m512i quiet_bit = _mm512_set1_epi32(0x00400000);
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i));
    __m512i f = _mm512_castps_si512(_mm512_cvtph_ps(h));
    const __m256i snan = _mm256_andnot_si256(_mm256_cmpeq_epi16(_mm256_and_si256(h, payload), zero),
                                             _mm256_cmpeq_epi16(_mm256_and_si256(h, exp_quiet), signalling));
    f = _mm512_andnot_si512(_mm512_and_si512(_mm512_cvtepi16_epi32(snan), quiet_bit), f);
    _mm512_storeu_si512(dst + i, f);
  }
  _mm256_zeroupper();
  widen_scalar(dst + i, src + i, n - i);
}

__attribute__((target("avx2,f16c"))) void narrow_f16c(std::uint16_t* dst, const float* src, std::size_t n) {
  const __m256 nan = _mm256_castsi256_ps(_mm256_set1_epi32(kNanAsHalf7fff));
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 v = _mm256_loadu_ps(src + i);
    v = _mm256_blendv_ps(v, nan, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), _mm256_cvtps_ph(v, kRound));
  }
  _mm256_zeroupper();
  narrow_scalar(dst + i, src + i, n - i);
}

__attribute__((target("avx2,f16c"))) void widen_f16c(float* dst, const std::uint16_t* src, std::size_t n) {
  const __m128i exp_quiet = _mm_set1_epi16(0x7e00), signalling = _mm_set1_epi16(0x7c00);
  const __m128i payload = _mm_set1_epi16(0x01ff), zero = _mm_setzero_si128();
  const __m256i quiet_bit = _mm256_set1_epi32(0x00400000);
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    __m256i f = _mm256_castps_si256(_mm256_cvtph_ps(h));
    const __m128i snan = _mm_andnot_si128(_mm_cmpeq_epi16(_mm_and_si128(h, payload), zero),
                                          _mm_cmpeq_epi16(_mm_and_si128(h, exp_quiet), signalling));
    f = _mm256_andnot_si256(_mm256_and_si256(_mm256_cvtepi16_epi32(snan), quiet_bit), f);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), f);
  }
  _mm256_zeroupper();
  widen_scalar(dst + i, src + i, n - i);
}

// Scaling in one pass: 16 elements widened, tested (v - v is NaN exactly for inf and NaN),
// multiplied and narrowed in registers. A NaN product narrows to 0x7fff as the reference does
// (a signalling input NaN is quiet after the multiply on both sides, so no other fix-up).
__attribute__((target("avx512f"))) bool scale_half_avx512(std::uint16_t* x, std::size_t n, float factor) {
  const __m512 f = _mm512_set1_ps(factor), zero = _mm512_setzero_ps();
  const __m512 nan = _mm512_castsi512_ps(_mm512_set1_epi32(kNanAsHalf7fff));
  __mmask16 bad = 0;
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 v = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i)));
    bad |= _mm512_cmp_ps_mask(_mm512_sub_ps(v, v), zero, _CMP_NEQ_UQ);
    __m512 r = _mm512_mul_ps(v, f);
    r = _mm512_mask_mov_ps(r, _mm512_cmp_ps_mask(r, r, _CMP_UNORD_Q), nan);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(x + i), _mm512_cvtps_ph(r, kRound));
  }
  _mm256_zeroupper();
  return scale_half_scalar(x + i, n - i, factor) || bad != 0;
}

__attribute__((target("avx2,f16c"))) bool scale_half_f16c(std::uint16_t* x, std::size_t n, float factor) {
  const __m256 f = _mm256_set1_ps(factor), zero = _mm256_setzero_ps();
  const __m256 nan = _mm256_castsi256_ps(_mm256_set1_epi32(kNanAsHalf7fff));
  __m256 bad = zero;
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x + i)));
    bad = _mm256_or_ps(bad, _mm256_cmp_ps(_mm256_sub_ps(v, v), zero, _CMP_NEQ_UQ));
    __m256 r = _mm256_mul_ps(v, f);
    r = _mm256_blendv_ps(r, nan, _mm256_cmp_ps(r, r, _CMP_UNORD_Q));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(x + i), _mm256_cvtps_ph(r, kRound));
  }
  const bool any_bad = _mm256_movemask_ps(bad) != 0;
  _mm256_zeroupper();
  return scale_half_scalar(x + i, n - i, factor) || any_bad;
}

// bfloat16: widened by a shift, narrowed with round to nearest even in integers (NaN -> 0x7fff),
// packed back with vpmovdw.
__attribute__((target("avx512f"))) bool scale_bf16_avx512(std::uint16_t* x, std::size_t n, float factor) {
  const __m512 f = _mm512_set1_ps(factor), zero = _mm512_setzero_ps();
  const __m512i one = _mm512_set1_epi32(1), round = _mm512_set1_epi32(0x7fff), nan = _mm512_set1_epi32(0x7fff);
  __mmask16 bad = 0;
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i)));
    const __m512 v = _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
    bad |= _mm512_cmp_ps_mask(_mm512_sub_ps(v, v), zero, _CMP_NEQ_UQ);
    const __m512 r = _mm512_mul_ps(v, f);
    const __m512i b = _mm512_castps_si512(r);
    __m512i o = _mm512_srli_epi32(
        _mm512_add_epi32(_mm512_add_epi32(b, round), _mm512_and_si512(_mm512_srli_epi32(b, 16), one)), 16);
    o = _mm512_mask_mov_epi32(o, _mm512_cmp_ps_mask(r, r, _CMP_UNORD_Q), nan);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(x + i), _mm512_cvtepi32_epi16(o));
  }
  _mm256_zeroupper();
  return scale_bf16_scalar(x + i, n - i, factor) || bad != 0;
}

// bfloat16 on CPUs with AVX512_BF16 (Cooper Lake, Sapphire Rapids, Zen 4): 32 elements a turn, widened
// by zero-extension and a shift, narrowed two vectors at once by vcvtne2ps2bf16 (round to nearest
// even, as the reference). Where the instruction differs from the reference it is fixed up: a NaN
// narrows to 0x7fff (the instruction keeps sign and payload), and a turn with a denormal product
// (the instruction takes denormal inputs as zero) is narrowed in integers instead.
__attribute__((target("avx512f,avx512bw,avx512dq,avx512bf16"))) bool scale_bf16_avx512bf16(std::uint16_t* x,
                                                                                           std::size_t n,
                                                                                           float factor) {
  const __m512 f = _mm512_set1_ps(factor);
  const __m512i nan = _mm512_set1_epi16(0x7fff);
  constexpr int kInfOrNan = 0x01 | 0x08 | 0x10 | 0x80, kDenormal = 0x20;  // vfpclassps classes
  __mmask16 bad = 0;
  std::size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    const __m512 lo = _mm512_castsi512_ps(
        _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i))), 16));
    const __m512 hi = _mm512_castsi512_ps(
        _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i + 16))), 16));
    bad = _kor_mask16(bad, _kor_mask16(_mm512_fpclass_ps_mask(lo, kInfOrNan), _mm512_fpclass_ps_mask(hi, kInfOrNan)));
    const __m512 r_lo = _mm512_mul_ps(lo, f), r_hi = _mm512_mul_ps(hi, f);
    if (!_kortestz_mask16_u8(_mm512_fpclass_ps_mask(r_lo, kDenormal), _mm512_fpclass_ps_mask(r_hi, kDenormal))) {
      (void)scale_bf16_avx512(x + i, 32, factor);  // rare: tiny products, rounded in integers
      continue;
    }
    const __m512i packed = (__m512i)_mm512_cvtne2ps_pbh(r_hi, r_lo);  // words 0-15 from r_lo
    const __mmask32 unordered =
        _mm512_kunpackw(_mm512_cmp_ps_mask(r_hi, r_hi, _CMP_UNORD_Q), _mm512_cmp_ps_mask(r_lo, r_lo, _CMP_UNORD_Q));
    _mm512_storeu_si512(x + i, _mm512_mask_mov_epi16(packed, unordered, nan));
  }
  return scale_bf16_avx512(x + i, n - i, factor) || bad != 0;
}
#endif

// Every version this CPU runs, the widest first.
std::vector<HalfConversion> supported() {
  std::vector<HalfConversion> v;
#if defined(GPUCLOUD_F16_X86)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
      __builtin_cpu_supports("avx512bf16")) {
    v.push_back({"avx512bf16", narrow_avx512, widen_avx512, scale_half_avx512, scale_bf16_avx512bf16});
  }
  if (__builtin_cpu_supports("avx512f")) {
    v.push_back({"avx512f", narrow_avx512, widen_avx512, scale_half_avx512, scale_bf16_avx512});
  }
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c")) {
    v.push_back({"f16c", narrow_f16c, widen_f16c, scale_half_f16c, scale_bf16_scalar});
  }
#endif
  v.push_back({"scalar", narrow_scalar, widen_scalar, scale_half_scalar, scale_bf16_scalar});
  return v;
}

const HalfConversion& in_use() {
  static const HalfConversion c = supported().front();
  return c;
}

}  // namespace

void floats_to_halves(std::uint16_t* dst, const float* src, std::size_t n) { in_use().narrow(dst, src, n); }
bool scale_halves(std::uint16_t* x, std::size_t n, float factor) { return in_use().scale_half(x, n, factor); }
bool scale_bfloat16s(std::uint16_t* x, std::size_t n, float factor) { return in_use().scale_bf16(x, n, factor); }
void halves_to_floats(float* dst, const std::uint16_t* src, std::size_t n) { in_use().widen(dst, src, n); }
std::vector<HalfConversion> half_conversions() { return supported(); }

}  // namespace gpucloud::kernels::host
