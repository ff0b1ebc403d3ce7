// The training-step ops on every device, against direct computations.
#include <gpucloud/amp/loss_scaler.hpp>
#include <gpucloud/compute/cast.hpp>
#include <gpucloud/compute/nn_ops.hpp>
#include <gpucloud/memory/buffer.hpp>
#include <gpucloud/movement/copy.hpp>
#include <gpucloud/runtime/error.hpp>

#include <gtest/gtest.h>

#include "buffer_values.hpp"
#include "device_cases.hpp"

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

namespace gc = gpucloud;

namespace {
using gc::testing::make;
using gc::testing::read;
}  // namespace

class NnOpsTest : public gc::testing::OnEveryDevice {};

TEST_P(NnOpsTest, MseLossAndScaledGradient) {
  gc::Stream s(device());
  std::mt19937 rng(1);
  std::normal_distribution<float> normal;
  const std::size_t n = 3001;
  std::vector<float> p(n), t(n);
  for (auto& x : p) x = normal(rng);
  for (auto& x : t) x = normal(rng);
  gc::Buffer pred = make(p, gc::DType::float32, device(), s), target = make(t, gc::DType::float32, device(), s);
  gc::Buffer loss(1, gc::DType::float32, device()), grad(n, gc::DType::float32, device());
  gc::LossScalerOptions o;
  o.init_scale = 8.0f;
  gc::LossScaler scaler(device(), s, o);
  gc::mse_loss(pred, target, loss, grad, s, &scaler);
  double want = 0;
  for (std::size_t i = 0; i < n; ++i) want += double(p[i] - t[i]) * (p[i] - t[i]);
  want /= n;
  EXPECT_NEAR(read(loss, s)[0], want, want * 1e-5);
  const auto g = read(grad, s);
  for (std::size_t i = 0; i < n; i += 97) EXPECT_FLOAT_EQ(g[i], 2.0f * (p[i] - t[i]) / n * 8.0f);
  gc::Buffer g16(n, gc::DType::float16, device());
  gc::LossScaler huge(device(), s);  // 65536: the fp16 gradient overflows where |2 d / n| * 65536 > 65504
  gc::mse_loss(pred, target, loss, g16, s, &huge);
  std::size_t overflowed = 0;
  for (float v : read(g16, s)) overflowed += std::isinf(v);  // read() synchronises before the buffers go
  std::size_t expected_overflows = 0;
  for (std::size_t i = 0; i < n; ++i) expected_overflows += std::fabs(2.0 * (p[i] - t[i]) / n * 65536.0) >= 65520.0;
  EXPECT_EQ(overflowed, expected_overflows);
  EXPECT_THROW(gc::mse_loss(pred, target, loss, gc::Buffer(3, gc::DType::float32, device()), s), gc::InvalidArgument);
}

TEST_P(NnOpsTest, ReluBackwardAndBiasGrad) {
  gc::Stream s(device());
  const std::vector<float> act = {0.0f, 1.5f, -2.0f, 3.0f, 0.25f, 0.0f};
  const std::vector<float> g = {1, 2, 3, 4, 5, 6};
  gc::Buffer a = make(act, gc::DType::float16, device(), s), grad = make(g, gc::DType::float16, device(), s);
  gc::relu_backward(grad, a, s);
  EXPECT_EQ(read(grad, s), (std::vector<float>{0, 2, 0, 4, 5, 0}));
  gc::Buffer bias(3, gc::DType::float32, device());
  gc::bias_grad(grad, 2, 3, bias, s);  // rows [0 2 0], [4 5 0]
  EXPECT_EQ(read(bias, s), (std::vector<float>{4, 7, 0}));
  EXPECT_THROW(gc::bias_grad(grad, 4, 3, bias, s), gc::InvalidArgument);
}

// Shapes around the host's 512-column strips and odd sizes, fp32, fp16 and bf16 gradients and
// activations: each column's rows summed in order in fp32, exactly as the reference does it (the
// host's vectorised loops and the GPU's one-column threads give the same bits), and the fp16
// output rounds that sum once.
TEST_P(NnOpsTest, BiasGradAndReluBackwardOnRandomShapes) {
  gc::Stream s(device());
  std::mt19937 rng(7);
  std::normal_distribution<float> normal;
  const std::pair<std::int64_t, std::int64_t> shapes[] = {{1, 1},    {7, 33},  {100, 70}, {3, 100},
                                                          {257, 31}, {64, 32}, {3, 513},  {2, 1030}};
  const gc::DType act_types[] = {gc::DType::float32, gc::DType::bfloat16, gc::DType::float16};
  int round = 0;
  for (const auto& [rows, cols] : shapes) {
    for (auto dtype : {gc::DType::float32, gc::DType::float16, gc::DType::bfloat16}) {
      const auto n = static_cast<std::size_t>(rows * cols);
      std::vector<float> g(n), act(n);
      for (auto& x : g) x = normal(rng);
      for (auto& x : act) x = normal(rng);
      const gc::DType act_type = act_types[round++ % 3];
      gc::Buffer grad = make(g, dtype, device(), s), a = make(act, act_type, device(), s);
      const std::vector<float> g_as_stored = read(grad, s), a_as_stored = read(a, s);
      gc::relu_backward(grad, a, s);
      const std::vector<float> masked = read(grad, s);
      for (std::size_t i = 0; i < n; ++i) {
        ASSERT_EQ(masked[i], a_as_stored[i] > 0.0f ? g_as_stored[i] : 0.0f) << rows << "x" << cols << " at " << i;
      }
      gc::Buffer bias(static_cast<std::size_t>(cols), gc::DType::float32, device());
      gc::Buffer bias16(static_cast<std::size_t>(cols), gc::DType::float16, device());
      gc::fill(bias, std::nan(""), s);  // every column must be written
      gc::bias_grad(grad, rows, cols, bias, s);
      gc::bias_grad(grad, rows, cols, bias16, s);
      const std::vector<float> got = read(bias, s), got16 = read(bias16, s);
      for (std::int64_t j = 0; j < cols; ++j) {
        float ref = 0;
        for (std::int64_t i = 0; i < rows; ++i) ref += masked[static_cast<std::size_t>(i * cols + j)];
        const auto k = static_cast<std::size_t>(j);
        EXPECT_EQ(got[k], ref) << rows << "x" << cols << " column " << j << " " << gc::dtype_name(dtype);
        EXPECT_EQ(got16[k], static_cast<float>(gc::Half(ref))) << rows << "x" << cols << " column " << j;
      }
    }
  }
}

// Every 16-bit activation against gradients of every kind (NaNs with payloads, infinities, zeros of
// both signs, denormals) for a gradient and activation of one 16-bit type: the host masks in the
// bits, and must give the bits of rounding (act > 0 ? grad : 0) back, as the mixed-type loops do.
TEST(NnOpsBits, SameType16BitReluBackwardIsTheReferenceForEveryActivation) {
  gc::Stream s(gc::Device::host());
  for (const gc::DType t : {gc::DType::float16, gc::DType::bfloat16}) {
    const bool half = t == gc::DType::float16;
    auto to_float = [&](std::uint16_t b) {
      return half ? gc::detail::half_bits_to_float(b) : gc::detail::bfloat16_bits_to_float(b);
    };
    auto to_bits = [&](float f) {
      return half ? gc::detail::float_to_half_bits(f) : gc::detail::float_to_bfloat16_bits(f);
    };
    constexpr std::size_t n = 65536;
    gc::Buffer grad(n, t), act(n, t);
    auto* grad_bits = static_cast<std::uint16_t*>(grad.data());
    auto* act_bits = static_cast<std::uint16_t*>(act.data());
    std::vector<std::uint16_t> g(n);
    for (std::uint32_t i = 0; i < n; ++i) {
      act_bits[i] = static_cast<std::uint16_t>(i);
      g[i] = static_cast<std::uint16_t>((i * 40503u) >> 3);  // every kind of value, unrelated to act
      grad_bits[i] = g[i];
    }
    gc::relu_backward(grad, act, s);
    s.synchronize();
    int wrong = 0;
    for (std::uint32_t i = 0; i < n && wrong < 10; ++i) {
      const std::uint16_t want = to_bits(to_float(static_cast<std::uint16_t>(i)) > 0.0f ? to_float(g[i]) : 0.0f);
      const std::uint16_t got = grad_bits[i];
      if (got != want) {
        ADD_FAILURE() << gc::dtype_name(t) << " act 0x" << std::hex << i << " grad 0x" << g[i] << ": 0x" << got
                      << ", not 0x" << want;
        ++wrong;
      }
    }
  }
}

GPUCLOUD_INSTANTIATE_ON_EVERY_DEVICE(NnOpsTest);
