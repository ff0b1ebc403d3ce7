// The host backend's native bf16 product: a oneDNN matmul primitive (bf16 x bf16 -> fp32 or bf16,
// alpha as its output scale, applied to the fp32 sum before the one rounding), one per shape, cached per calling thread
// (the stream worker), so a repeated GEMM costs oneDNN's execution and nothing else. Transposes are strides of the
// plain memory descriptors, so no operand is copied.
#include "compute/gemm/host/host_bf16_gemm.hpp"

#include "gpucloud/runtime/error.hpp"

#if GPUCLOUD_WITH_ONEDNN
#include "compute/host/onednn.hpp"
#include "compute/host/recent_cache.hpp"

#include <algorithm>
#include <array>
#include <cstring>
#include <string>
#include <unordered_map>
#include <utility>
#endif

namespace gpucloud::detail {

#if GPUCLOUD_WITH_ONEDNN

namespace {

// Native bf16 dot products (vdpbf16ps) or AMX: below that oneDNN emulates bf16 with conversions,
// and the widening path (vectorised casts + OpenBLAS) is as fast and needs no OpenMP team.
bool cpu_has_native_bf16() noexcept {
  try {
    const auto isa = static_cast<unsigned>(dnnl::get_effective_cpu_isa());
    const auto bf16 = static_cast<unsigned>(dnnl::cpu_isa::avx512_core_bf16);
    return (isa & bf16) == bf16;
  } catch (...) {
    return false;
  }
}

using Key = std::array<std::int64_t, 13>;

struct Cached {
  dnnl::matmul::primitive_desc pd;
  dnnl::matmul product;
};

// Shapes per thread, most recent first (a primitive holds no operand memory).
constexpr std::size_t kCachedShapes = 64;

Cached& cached_product(const Key& key) {
  thread_local RecentCache<Key, Cached, kCachedShapes> cache;
  if (Cached* hit = cache.find(key)) return *hit;
  const auto [ta, tb, m, n, k, lda, ldb, ldc, alpha_bits, c_bf16, bias, bias_bf16, relu] = key;
  using tag = dnnl::memory::data_type;
  const dnnl::memory::desc a_md({m, k}, tag::bf16, ta ? dnnl::memory::dims{1, lda} : dnnl::memory::dims{lda, 1});
  const dnnl::memory::desc b_md({k, n}, tag::bf16, tb ? dnnl::memory::dims{1, ldb} : dnnl::memory::dims{ldb, 1});
  const dnnl::memory::desc c_md({m, n}, c_bf16 ? tag::bf16 : tag::f32, dnnl::memory::dims{ldc, 1});
  dnnl::primitive_attr attr;
  float alpha = 0.0f;
  static_assert(sizeof(alpha) == sizeof(std::uint32_t));
  const auto bits = static_cast<std::uint32_t>(alpha_bits);
  std::memcpy(&alpha, &bits, sizeof(alpha));
  if (alpha != 1.0f) attr.set_output_scales(0, {alpha});
  if (relu) {
    dnnl::post_ops ops;
    ops.append_eltwise(1.0f, dnnl::algorithm::eltwise_relu, 0.0f, 0.0f);
    attr.set_post_ops(ops);
  }
  const dnnl::memory::desc bias_md({1, n}, bias_bf16 ? tag::bf16 : tag::f32, dnnl::memory::dims{n, 1});
  dnnl::matmul::primitive_desc pd(
      bias ? dnnl::matmul::desc(a_md, b_md, bias_md, c_md) : dnnl::matmul::desc(a_md, b_md, c_md), attr,
      onednn_engine());
  return cache.insert(key, Cached{pd, dnnl::matmul(pd)});
}

}  // namespace

bool host_bf16_gemm_available() noexcept {
  static const bool available = cpu_has_native_bf16();
  return available;
}

bool host_bf16_gemm(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
                    const std::uint16_t* a, std::int64_t lda, const std::uint16_t* b, std::int64_t ldb, void* c,
                    std::int64_t ldc, bool c_bf16, const void* bias, bool bias_bf16, bool relu) {
  if (!host_bf16_gemm_available()) return false;
  if (k == 0 && (bias != nullptr || relu)) return false;  // the caller's finishing pass handles it
  if (k == 0) {  // an empty sum: C = 0 (oneDNN wants every dimension positive; bf16's zero is all 0 bits)
    for (std::int64_t i = 0; i < m; ++i) {
      if (c_bf16) {
        std::fill_n(static_cast<std::uint16_t*>(c) + i * ldc, n, std::uint16_t{0});
      } else {
        std::fill_n(static_cast<float*>(c) + i * ldc, n, 0.0f);
      }
    }
    return true;
  }
  if (m == 0 || n == 0) return true;
  std::uint32_t alpha_bits = 0;
  std::memcpy(&alpha_bits, &alpha, sizeof(alpha));
  const Key key{trans_a, trans_b,         m,         n,   k, lda, ldb, ldc, static_cast<std::int64_t>(alpha_bits),
                c_bf16,  bias != nullptr, bias_bf16, relu};
  try {
    Cached& p = cached_product(key);
    dnnl::stream stream(onednn_engine());
    // oneDNN takes non-const handles; it only reads the source and weights.
    dnnl::memory am(p.pd.src_desc(), onednn_engine(), const_cast<std::uint16_t*>(a));
    dnnl::memory bm(p.pd.weights_desc(), onednn_engine(), const_cast<std::uint16_t*>(b));
    dnnl::memory cm(p.pd.dst_desc(), onednn_engine(), c);
    std::unordered_map<int, dnnl::memory> args{{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}};
    if (bias != nullptr) {
      args.emplace(DNNL_ARG_BIAS, dnnl::memory(p.pd.bias_desc(), onednn_engine(), const_cast<void*>(bias)));
    }
    p.product.execute(stream, args);
    stream.wait();
  } catch (const dnnl::error& e) {
    // Raised while the stream runs the product: reported by its next synchronisation, typed.
    throw_onednn_error("dnnl::matmul", e, __FILE__, __LINE__);
  }
  return true;
}

const char* host_bf16_gemm_implementation() noexcept {
  return host_bf16_gemm_available() ? "oneDNN" : "widened to fp32";
}

#else

bool host_bf16_gemm_available() noexcept { return false; }

bool host_bf16_gemm(bool, bool, std::int64_t, std::int64_t, std::int64_t, float, const std::uint16_t*, std::int64_t,
                    const std::uint16_t*, std::int64_t, void*, std::int64_t, bool, const void*, bool, bool) {
  return false;
}

const char* host_bf16_gemm_implementation() noexcept { return "widened to fp32"; }

#endif

}  // namespace gpucloud::detail
