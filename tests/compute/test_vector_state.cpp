// The host kernels run AVX-512 / AVX2 code; each must clear the upper halves of the vector
// registers (vzeroupper) before it returns to code that may be plain SSE. Left dirty, a caller's
// SSE instructions afterwards run many times slower on Intel CPUs: libm's sinf in train_mlp's data
// loader took 20x its time after one fp16 gc::cast (GCC omitted the vzeroupper before a tail
// call). The processor reports dirty upper halves in XINUSE (xgetbv with ecx = 1): bit 2 for
// YMM0-15's upper 128 bits, bit 6 for ZMM0-15's upper 256. Every op below runs on its stream's
// worker or inline on the caller, so both threads are read after it.
#include <gpucloud/gpucloud.hpp>

#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>
#endif

namespace gc = gpucloud;

namespace {

#if defined(__x86_64__) && defined(__GNUC__)
// XINUSE can be read: the OS enabled XSAVE (CPUID.1:ECX.OSXSAVE) and the CPU has XGETBV with
// ecx = 1 (CPUID.(0xd, 1):EAX bit 2); and the CPU has AVX, so the state exists at all.
bool xinuse_readable() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid(1, &a, &b, &c, &d) == 0 || (c & (1u << 27)) == 0 || (c & (1u << 28)) == 0) return false;
  if (__get_cpuid_count(0xd, 1, &a, &b, &c, &d) == 0) return false;
  return (a & (1u << 2)) != 0;
}

bool upper_halves_dirty() {
  std::uint32_t lo = 0, hi = 0;
  asm volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(1u));
  return (lo & ((1u << 2) | (1u << 6))) != 0;
}

void clear_upper_halves() { asm volatile("vzeroupper" ::: "memory"); }
#endif

gc::Buffer filled(std::size_t n, gc::DType t, double v, gc::StreamView s) {
  gc::Buffer b(n, t, gc::Device::host());
  gc::fill(b, v, s);
  return b;
}

}  // namespace

TEST(VectorState, HostKernelsLeaveTheUpperHalvesClean) {
#if defined(__x86_64__) && defined(__GNUC__)
  if (!xinuse_readable()) GTEST_SKIP() << "this CPU cannot report XINUSE (xgetbv ecx=1) or has no AVX";
  // The check itself: AVX work without vzeroupper is seen (else every pass below is vacuous).
  {
    unsigned a = 0, b = 0, c = 0, d = 0;
    const bool avx512 = __get_cpuid_count(7, 0, &a, &b, &c, &d) != 0 && (b & (1u << 16)) != 0;
    if (avx512) {
      asm volatile("vpternlogd $0xff, %%zmm1, %%zmm1, %%zmm1" ::: "xmm1");
    } else {
      asm volatile("vxorps %%ymm1, %%ymm1, %%ymm1\n\tvcmpps $0, %%ymm1, %%ymm1, %%ymm1" ::: "xmm1");
    }
    const bool seen = upper_halves_dirty();
    clear_upper_halves();
    EXPECT_TRUE(seen) << "XINUSE did not report a vector register's upper half in use";
    EXPECT_FALSE(upper_halves_dirty()) << "vzeroupper did not clear XINUSE's bits";
  }
  gc::Stream s(gc::Device::host());
  // Lengths with a vector body and every kind of tail.
  const std::size_t n = 1000 + 13;
  const auto cast = [&](gc::DType from, gc::DType to) {
    gc::Buffer src = filled(n, from, 1.5, s), dst(n, to, gc::Device::host());
    gc::cast(dst, src, s);
    s.synchronize();
  };
  const std::vector<std::pair<std::string, std::function<void()>>> ops = {
      {"cast f32->f16", [&] { cast(gc::DType::float32, gc::DType::float16); }},
      {"cast f16->f32", [&] { cast(gc::DType::float16, gc::DType::float32); }},
      {"cast f32->bf16", [&] { cast(gc::DType::float32, gc::DType::bfloat16); }},
      {"unscale f16, bf16, f32",
       [&] {
         gc::LossScaler scaler(gc::Device::host(), s);
         gc::Buffer a = filled(n, gc::DType::float16, 2.0, s), b = filled(n, gc::DType::bfloat16, 2.0, s),
                    c = filled(n, gc::DType::float32, 2.0, s);
         scaler.unscale({a.view()}, s);
         scaler.unscale({b.view()}, s);
         scaler.unscale({c.view()}, s);
         s.synchronize();
       }},
      {"relu_backward, bias_grad f16",
       [&] {
         gc::Buffer g = filled(64 * 17, gc::DType::float16, 1.0, s), act = filled(64 * 17, gc::DType::float16, 1.0, s);
         gc::Buffer bias(17, gc::DType::float32, gc::Device::host());
         gc::relu_backward(g, act, s);
         gc::bias_grad(g, 64, 17, bias, s);
         s.synchronize();
       }},
      {"gemm f16",
       [&] {
         gc::Buffer a = filled(33 * 17, gc::DType::float16, 1.0, s), b = filled(17 * 29, gc::DType::float16, 1.0, s);
         gc::Buffer c(33 * 29, gc::DType::float16, gc::Device::host());
         gc::GemmArgs args;
         args.m = 33;
         args.n = 29;
         args.k = 17;
         gc::gemm(c, a, b, args, s);
         s.synchronize();
       }},
  };
  for (const auto& [name, op] : ops) {
    SCOPED_TRACE(name);
    clear_upper_halves();
    op();
    EXPECT_FALSE(upper_halves_dirty()) << "on the calling thread";
    bool worker_dirty = true;
    gc::launch_host_func(s, [&worker_dirty] { worker_dirty = upper_halves_dirty(); });
    s.synchronize();
    EXPECT_FALSE(worker_dirty) << "on the stream's worker";
  }
#else
  GTEST_SKIP() << "x86-64 only";
#endif
}
