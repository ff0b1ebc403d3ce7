// The loss scaler on every device: PyTorch GradScaler's trajectory step for step (against an
// independent re-implementation of its rule), state round trips, bad options, the fused unscale
// over thousands of mixed-dtype tensors and every fp16/bf16 bit pattern, and an fp16 model that
// trains to its fp32 twin's loss because the scaler backs off.
#include <gpucloud/amp/loss_scaler.hpp>
#include <gpucloud/amp/optimizers.hpp>
#include <gpucloud/compute/cast.hpp>
#include <gpucloud/memory/buffer.hpp>
#include <gpucloud/movement/copy.hpp>
#include <gpucloud/runtime/error.hpp>
#include <gpucloud/runtime/stream.hpp>

#include <gtest/gtest.h>

#include "buffer_values.hpp"
#include "device_cases.hpp"

#include <cmath>
#include <cstring>
#include <future>
#include <limits>
#include <memory>
#include <random>
#include <vector>

namespace gc = gpucloud;
using gc::testing::download;
using gc::testing::upload;

namespace {

// PyTorch GradScaler's rule, written independently of the library.
struct ReferenceScaler {
  double scale;
  int tracker = 0;
  int hysteresis_left;
  gc::LossScalerOptions o;
  explicit ReferenceScaler(gc::LossScalerOptions opts)
      : scale(opts.init_scale), hysteresis_left(opts.hysteresis), o(opts) {}
  void update(bool overflow) {
    if (overflow) {
      if (hysteresis_left > 1) {
        --hysteresis_left;
      } else {
        scale = std::max(static_cast<double>(static_cast<float>(scale * o.backoff_factor)),
                         static_cast<double>(o.min_scale));
        hysteresis_left = o.hysteresis;
      }
      tracker = 0;
    } else if (++tracker == o.growth_interval) {
      const float grown = static_cast<float>(scale * o.growth_factor);
      if (std::isfinite(grown)) scale = grown;
      tracker = 0;
    }
  }
};

}  // namespace

class LossScalerTest : public gc::testing::OnEveryDevice {};

TEST(LossScalerDefaults, AreGradScalers) {
  const gc::LossScalerOptions o;
  EXPECT_EQ(o.init_scale, 65536.0f);
  EXPECT_EQ(o.growth_factor, 2.0f);
  EXPECT_EQ(o.backoff_factor, 0.5f);
  EXPECT_EQ(o.growth_interval, 2000);
  EXPECT_EQ(o.hysteresis, 1);
  EXPECT_EQ(o.min_scale, 0.0f);
  EXPECT_TRUE(o.dynamic);
}

TEST_P(LossScalerTest, ScaleTrajectoryFollowsTheRuleStepForStep) {
  gc::Stream s(device());
  struct Case {
    gc::LossScalerOptions options;
    std::vector<int> overflow;  // 1: a step with an inf gradient
  };
  gc::LossScalerOptions grow3;
  grow3.init_scale = 1024.0f;
  grow3.growth_interval = 3;
  gc::LossScalerOptions near_max = grow3;  // growth would overflow fp32: the scale stays
  near_max.init_scale = std::ldexp(1.0f, 127);
  near_max.growth_interval = 2;
  gc::LossScalerOptions hysteretic = grow3;
  hysteretic.hysteresis = 2;
  hysteretic.min_scale = 256.0f;
  const std::vector<int> script = {0, 0, 0, 0, 1, 0, 0, 0, 1, 1, 0, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 1, 0};
  for (const Case& c : {Case{grow3, script}, Case{near_max, script}, Case{hysteretic, script}}) {
    gc::LossScaler scaler(device(), s, c.options);
    ReferenceScaler ref(c.options);
    gc::Buffer grad(100, gc::DType::float16, device());
    for (std::size_t step = 0; step < c.overflow.size(); ++step) {
      std::vector<float> g(100, 1.0f);
      if (c.overflow[step]) g[37] = std::numeric_limits<float>::infinity();
      gc::testing::write(grad, g, s);
      scaler.unscale({grad}, s);
      EXPECT_EQ(scaler.state(s).found_inf, c.overflow[step] == 1) << "step " << step;
      scaler.update(s);
      ref.update(c.overflow[step] == 1);
      const auto st = scaler.state(s);
      ASSERT_EQ(st.scale, static_cast<float>(ref.scale)) << "step " << step << " init " << c.options.init_scale;
      ASSERT_EQ(st.growth_tracker, ref.tracker) << "step " << step;
      ASSERT_EQ(st.hysteresis_left, ref.hysteresis_left) << "step " << step;
      EXPECT_FALSE(st.found_inf);  // cleared by update
    }
  }
}

TEST_P(LossScalerTest, StaticScalerNeverChangesAndStateRoundTrips) {
  gc::Stream s(device());
  gc::LossScalerOptions o;
  o.dynamic = false;
  o.init_scale = 128.0f;
  gc::LossScaler scaler(device(), s, o);
  gc::Buffer grad = upload(std::vector<float>{std::nanf("")}, device(), s);
  scaler.unscale({grad}, s);
  scaler.update(s);
  EXPECT_EQ(scaler.state(s).scale, 128.0f);
  gc::LossScaler dynamic(device(), s);
  dynamic.load_state(gc::LossScalerState{512.0f, 17, 1, false}, s);
  const auto st = dynamic.state(s);
  EXPECT_EQ(st.scale, 512.0f);
  EXPECT_EQ(st.growth_tracker, 17);
  EXPECT_THROW(dynamic.load_state(gc::LossScalerState{-1.0f, 0, 1, false}, s), gc::InvalidArgument);
  EXPECT_THROW(dynamic.load_state(gc::LossScalerState{1.0f, 5000, 1, false}, s), gc::InvalidArgument);
  EXPECT_EQ(dynamic.state(s).scale, 512.0f);  // state unchanged by the rejected loads
  gc::Buffer loss = upload(std::vector<float>{0.75f}, device(), s);
  dynamic.scale(loss, s);
  EXPECT_EQ(download<float>(loss, s)[0], 384.0f);
}

TEST_P(LossScalerTest, BadScalerOptionsAreTypedErrors) {
  gc::Stream s(device());
  auto with = [](auto change) {
    gc::LossScalerOptions o;
    change(o);
    return o;
  };
  EXPECT_THROW(gc::LossScaler(device(), s, with([](auto& o) { o.init_scale = 0.0f; })), gc::InvalidArgument);
  EXPECT_THROW(gc::LossScaler(device(), s, with([](auto& o) { o.growth_factor = 1.0f; })), gc::InvalidArgument);
  EXPECT_THROW(gc::LossScaler(device(), s, with([](auto& o) { o.backoff_factor = 1.0f; })), gc::InvalidArgument);
  EXPECT_THROW(gc::LossScaler(device(), s, with([](auto& o) { o.backoff_factor = -0.5f; })), gc::InvalidArgument);
  EXPECT_THROW(gc::LossScaler(device(), s, with([](auto& o) { o.growth_interval = 0; })), gc::InvalidArgument);
  EXPECT_THROW(gc::LossScaler(device(), s, with([](auto& o) { o.hysteresis = 0; })), gc::InvalidArgument);
  gc::LossScaler scaler(device(), s);
  gc::Buffer ints(4, gc::DType::int32, device());
  try {
    scaler.unscale({ints}, s);
    FAIL();
  } catch (const gc::InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("grads[0]"), std::string::npos) << e.what();
  }
}

TEST_P(LossScalerTest, UnscaleFindsOneNonFiniteValueAnywhereInThousandsOfTensors) {
  gc::Stream s(device());
  std::mt19937 rng(5);
  // Mixed dtypes and sizes: zero-size tensors, sizes that straddle the 65536-element chunks.
  std::vector<std::size_t> sizes;
  for (int i = 0; i < 2500; ++i) sizes.push_back(rng() % 97 == 0 ? 0 : rng() % 300);
  for (std::size_t big : {65535u, 65536u, 65537u, 131073u}) sizes.push_back(big);
  const gc::DType dtypes[] = {gc::DType::float32, gc::DType::float16, gc::DType::bfloat16};
  std::vector<gc::Buffer> grads;
  std::vector<gc::BufferView> views;
  std::vector<std::vector<float>> values;
  const float scale = 1024.0f;
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    grads.emplace_back(sizes[i], dtypes[i % 3], device());
    std::vector<float> v(sizes[i]);
    for (auto& x : v)
      x = static_cast<float>(static_cast<int>(rng() % 121) - 60) * scale;  // exact in every dtype, < 65504
    gc::testing::write(grads.back(), v, s);
    values.push_back(v);
    views.push_back(grads.back());
  }
  gc::LossScalerOptions o;
  o.init_scale = scale;
  gc::LossScaler scaler(device(), s, o);
  const int launches = scaler.unscale(views, s);
  EXPECT_GE(launches, static_cast<int>(views.size() / 110));
  EXPECT_LE(launches, static_cast<int>(views.size() / 50) + 10);
  EXPECT_FALSE(scaler.state(s).found_inf);
  // Unscaling by a power of two is exact.
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < views.size(); ++i) {
    const auto got = gc::testing::read(views[i], s);
    for (std::size_t j = 0; j < got.size(); ++j) wrong += got[j] != values[i][j] / scale;
  }
  EXPECT_EQ(wrong, 0u);
  // One inf or NaN hidden at the first element, the last, a bf16 tensor past a launch boundary,
  // and inside the big chunk-straddling tensors.
  struct Spot {
    std::size_t tensor, index;
    float value;
  };
  std::vector<Spot> spots;
  auto first_nonempty = [&](std::size_t from) {
    while (sizes[from] == 0) ++from;
    return from;
  };
  spots.push_back({first_nonempty(0), 0, std::numeric_limits<float>::infinity()});
  spots.push_back({sizes.size() - 1, sizes.back() - 1, std::nanf("")});
  const std::size_t bf = first_nonempty(1502 - 1502 % 3 + 2);
  spots.push_back({bf, sizes[bf] / 2, -std::numeric_limits<float>::infinity()});
  spots.push_back({sizes.size() - 3, 65535, std::nanf("")});
  for (const Spot& spot : spots) {
    auto v = gc::testing::read(views[spot.tensor], s);
    const float saved = v[spot.index];
    v[spot.index] = spot.value;
    gc::testing::write(views[spot.tensor], v, s);
    scaler.unscale(views, s);
    EXPECT_TRUE(scaler.state(s).found_inf) << "tensor " << spot.tensor << " index " << spot.index;
    scaler.update(s);  // backs off and clears found-inf
    v[spot.index] = saved;
    gc::testing::write(views[spot.tensor], v, s);
    scaler.unscale(views, s);
    EXPECT_FALSE(scaler.state(s).found_inf);
  }
}

// Unscaling by a scale that is no power of two rounds: every dtype's result is v * (1 / scale)
// rounded once, on any bits (subnormals, infinities, NaNs), in launches small enough to run in place
// and large enough to be split over the host's cores.
TEST_P(LossScalerTest, UnscaleRoundsEveryBitPatternOnceAndFlagsOnlyNonFiniteOnes) {
  gc::Stream s(device());
  std::mt19937 rng(21);
  gc::LossScalerOptions o;
  o.init_scale = 3.0f;
  for (auto dtype : {gc::DType::float32, gc::DType::float16, gc::DType::bfloat16}) {
    for (std::size_t n : {1000u, 300001u}) {
      for (bool with_non_finite : {false, true}) {
        std::vector<float> v(n);
        for (auto& x : v) {
          const std::uint32_t bits = static_cast<std::uint32_t>(rng());
          std::memcpy(&x, &bits, sizeof x);
          if (!with_non_finite && !std::isfinite(x)) x = 1.5f;
        }
        if (dtype != gc::DType::float32) {  // values fp16/bf16 can hold, their own subnormals included
          gc::Buffer rounded(n, dtype, device());
          gc::testing::write(rounded, v, s);
          v = gc::testing::read(rounded, s);
          for (auto& x : v) {
            if (!with_non_finite && !std::isfinite(x)) x = 1.5f;
          }
        }
        gc::Buffer grads(n, dtype, device()), expect(n, dtype, device());
        gc::testing::write(grads, v, s);
        std::vector<float> scaled(v);
        for (auto& x : scaled) x = x * (1.0f / 3.0f);
        gc::testing::write(expect, scaled, s);
        gc::LossScaler scaler(device(), s, o);
        scaler.unscale({grads}, s);
        EXPECT_EQ(scaler.state(s).found_inf, with_non_finite) << gc::dtype_name(dtype) << " n=" << n;
        if (dtype == gc::DType::float32) {
          EXPECT_EQ(download<std::uint32_t>(grads, s), download<std::uint32_t>(expect, s)) << "n=" << n;
        } else {
          EXPECT_EQ(download<std::uint16_t>(grads, s), download<std::uint16_t>(expect, s))
              << gc::dtype_name(dtype) << " n=" << n;
        }
      }
    }
  }
}

TEST_P(LossScalerTest, Fp16ModelTrainsToItsFp32TwinsLossBecauseTheScalerBacksOff) {
  gc::Stream s(device());
  // Linear regression: y = X w*, 64 samples, 16 features; gradients are O(10), so at scale 65536
  // fp16 gradients overflow (65504 is fp16's largest).
  const int n = 64, k = 16;
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> X(n * k), target(k), y(n);
  for (auto& x : X) x = normal(rng);
  for (auto& t : target) t = 3.0f * normal(rng);
  for (int i = 0; i < n; ++i) {
    y[i] = 0;
    for (int j = 0; j < k; ++j) y[i] += X[i * k + j] * target[j];
  }
  auto loss_and_grad = [&](const std::vector<float>& w, std::vector<float>& grad, float scale) {
    double loss = 0;
    std::fill(grad.begin(), grad.end(), 0.0f);
    for (int i = 0; i < n; ++i) {
      float r = -y[i];
      for (int j = 0; j < k; ++j) r += X[i * k + j] * w[j];
      loss += double(r) * r / n;
      for (int j = 0; j < k; ++j) grad[j] += 2.0f * r * X[i * k + j] / n * scale;
    }
    return loss;
  };
  gc::SgdOptions o;
  o.lr = 0.05f;
  o.momentum = 0.5f;
  // fp32 twin.
  gc::Buffer w32 = upload(std::vector<float>(k, 0.0f), device(), s), g32(k, gc::DType::float32, device());
  gc::FusedSGD twin({{w32, g32}}, o, s);
  // fp16 model with fp32 masters and a dynamic scaler.
  gc::Buffer w16(k, gc::DType::float16, device()), g16(k, gc::DType::float16, device());
  gc::testing::write(w16, std::vector<float>(k, 0.0f), s);
  gc::FusedSGD model({{w16, g16}}, o, s);
  gc::LossScaler scaler(device(), s);
  std::vector<float> grad(k);
  double twin_loss = 0, model_loss = 0;
  int skipped = 0;
  for (int step = 0; step < 300; ++step) {
    twin_loss = loss_and_grad(gc::testing::read(w32, s), grad, 1.0f);
    gc::testing::write(g32, grad, s);
    twin.step(s);
    const float scale = scaler.state(s).scale;  // read only to emulate a scaled backward here
    model_loss = loss_and_grad(gc::testing::read(w16, s), grad, scale);
    gc::testing::write(g16, grad, s);  // fp16 gradients: inf where scale * grad > 65504
    scaler.unscale({g16}, s);
    skipped += scaler.state(s).found_inf ? 1 : 0;
    model.step(s, &scaler);
    scaler.update(s);
  }
  EXPECT_GT(skipped, 0) << "the initial scale must overflow fp16";
  EXPECT_LT(scaler.state(s).scale, 65536.0f);
  EXPECT_LT(twin_loss, 1e-3);
  EXPECT_LT(model_loss, 1e-2);
  EXPECT_EQ(model.step_count(s), 300u - static_cast<std::size_t>(skipped));
}

GPUCLOUD_INSTANTIATE_ON_EVERY_DEVICE(LossScalerTest);
