// Mixed-precision training on every device: the loss scaler's trajectory (PyTorch's rule step
// for step), the fused unscale over thousands of mixed-dtype tensors, skipped steps, and the
// fused SGD / Adam / AdamW against float64 re-implementations of torch.optim's formulas.
#include <gpucloud/amp/loss_scaler.hpp>
#include <gpucloud/amp/optimizers.hpp>
#include <gpucloud/compute/cast.hpp>
#include <gpucloud/memory/buffer.hpp>
#include <gpucloud/movement/copy.hpp>
#include <gpucloud/runtime/error.hpp>
#include <gpucloud/runtime/stream.hpp>

#include <gtest/gtest.h>

#include "device_cases.hpp"

#include <cmath>
#include <cstring>
#include <future>
#include <limits>
#include <memory>
#include <random>
#include <vector>

namespace gc = gpucloud;

namespace {

template <class T>
gc::Buffer upload(const std::vector<T>& v, gc::Device d, gc::StreamView s, gc::DType dtype = gc::dtype_of<T>()) {
  gc::Buffer staging(v.size(), dtype, gc::Device::host(), gc::MemoryKind::pinned);
  if (!v.empty()) std::memcpy(staging.data(), v.data(), v.size() * sizeof(T));
  gc::Buffer out(v.size(), dtype, d, gc::MemoryKind::device);
  gc::copy(out, staging, s);
  s.synchronize();
  return out;
}

template <class T>
std::vector<T> download(gc::BufferView v, gc::StreamView s) {
  gc::Buffer staging(v.size(), v.dtype(), gc::Device::host(), gc::MemoryKind::pinned);
  gc::copy(staging, v, s);
  s.synchronize();
  std::vector<T> out(v.size());
  if (!out.empty()) std::memcpy(out.data(), staging.data(), out.size() * sizeof(T));
  return out;
}

// Widened float values of a float32/float16/bfloat16 buffer.
std::vector<float> as_floats(gc::BufferView v, gc::StreamView s) {
  gc::Buffer f(v.size(), gc::DType::float32, v.device(), gc::MemoryKind::device);
  gc::cast(f, v, s);
  return download<float>(f, s);
}

void upload_floats(gc::BufferView dst, const std::vector<float>& values, gc::StreamView s) {
  gc::Buffer f = upload(values, dst.device(), s);
  gc::cast(dst, f, s);
  s.synchronize();
}

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

class AmpTest : public gc::testing::OnEveryDevice {};

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

TEST_P(AmpTest, ScaleTrajectoryFollowsTheRuleStepForStep) {
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
      upload_floats(grad, g, s);
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

TEST_P(AmpTest, StaticScalerNeverChangesAndStateRoundTrips) {
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

TEST_P(AmpTest, BadScalerOptionsAreTypedErrors) {
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

TEST_P(AmpTest, UnscaleFindsOneNonFiniteValueAnywhereInThousandsOfTensors) {
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
    upload_floats(grads.back(), v, s);
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
    const auto got = as_floats(views[i], s);
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
    auto v = as_floats(views[spot.tensor], s);
    const float saved = v[spot.index];
    v[spot.index] = spot.value;
    upload_floats(views[spot.tensor], v, s);
    scaler.unscale(views, s);
    EXPECT_TRUE(scaler.state(s).found_inf) << "tensor " << spot.tensor << " index " << spot.index;
    scaler.update(s);  // backs off and clears found-inf
    v[spot.index] = saved;
    upload_floats(views[spot.tensor], v, s);
    scaler.unscale(views, s);
    EXPECT_FALSE(scaler.state(s).found_inf);
  }
}

// Unscaling by a scale that is no power of two rounds: every dtype's result is v * (1 / scale)
// rounded once, on any bits (subnormals, infinities, NaNs), in launches small enough to run in place
// and large enough to be split over the host's cores.
TEST_P(AmpTest, UnscaleRoundsEveryBitPatternOnceAndFlagsOnlyNonFiniteOnes) {
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
          upload_floats(rounded, v, s);
          v = as_floats(rounded, s);
          for (auto& x : v) {
            if (!with_non_finite && !std::isfinite(x)) x = 1.5f;
          }
        }
        gc::Buffer grads(n, dtype, device()), expect(n, dtype, device());
        upload_floats(grads, v, s);
        std::vector<float> scaled(v);
        for (auto& x : scaled) x = x * (1.0f / 3.0f);
        upload_floats(expect, scaled, s);
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

namespace {
// torch.optim reference in float64, one parameter tensor.
struct RefParam {
  std::vector<double> p, buf, m, v, vmax;
};

void ref_sgd(RefParam& r, const std::vector<float>& g, const gc::SgdOptions& o, int step) {
  for (std::size_t i = 0; i < r.p.size(); ++i) {
    double d = g[i];
    if (o.weight_decay != 0) d += o.weight_decay * r.p[i];
    if (o.momentum != 0) {
      r.buf[i] = step == 1 ? d : o.momentum * r.buf[i] + (1.0 - o.dampening) * d;
      d = o.nesterov ? d + o.momentum * r.buf[i] : r.buf[i];
    }
    r.p[i] -= o.lr * d;
  }
}

void ref_adam(RefParam& r, const std::vector<float>& g, const gc::AdamOptions& o, int step) {
  const double bc1 = 1 - std::pow(static_cast<double>(o.beta1), step);
  const double bc2 = 1 - std::pow(static_cast<double>(o.beta2), step);
  for (std::size_t i = 0; i < r.p.size(); ++i) {
    double d = g[i];
    if (o.weight_decay != 0) {
      if (o.decoupled_weight_decay) {
        r.p[i] *= 1 - static_cast<double>(o.lr) * o.weight_decay;
      } else {
        d += o.weight_decay * r.p[i];
      }
    }
    r.m[i] = o.beta1 * r.m[i] + (1 - static_cast<double>(o.beta1)) * d;
    r.v[i] = o.beta2 * r.v[i] + (1 - static_cast<double>(o.beta2)) * d * d;
    double second = r.v[i];
    if (o.amsgrad) second = r.vmax[i] = std::max(r.vmax[i], r.v[i]);
    const double denom = std::sqrt(second) / std::sqrt(bc2) + o.eps;
    r.p[i] -= (o.lr / bc1) * r.m[i] / denom;
  }
}

// Runs 100 steps of `opt` on two parameter tensors against the reference; returns the worst
// error relative to max(1, |ref|).
template <class Optimizer, class Options, class Ref>
double run_against_reference(gc::Device d, const Options& o, Ref ref_step, gc::DType param_dtype, bool check_master) {
  gc::Stream s(d);
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const std::size_t sizes[] = {1000, 70001};
  std::vector<gc::Buffer> params, grads;
  std::vector<RefParam> refs;
  std::vector<gc::ParamGrad> pg;
  for (std::size_t n : sizes) {
    std::vector<float> init(n);
    for (auto& x : init) x = normal(rng);
    params.emplace_back(n, param_dtype, d);
    upload_floats(params.back(), init, s);
    grads.emplace_back(n, gc::DType::float32, d);
    const auto widened = as_floats(params.back(), s);  // the reference starts where the model does
    refs.push_back({std::vector<double>(widened.begin(), widened.end()), std::vector<double>(n), std::vector<double>(n),
                    std::vector<double>(n), std::vector<double>(n)});
    pg.push_back({params.back(), grads.back()});
  }
  Optimizer opt(pg, o, s);
  for (int step = 1; step <= 100; ++step) {
    for (std::size_t t = 0; t < params.size(); ++t) {
      std::vector<float> g(sizes[t]);
      for (auto& x : g) x = normal(rng);
      upload_floats(grads[t], g, s);
      ref_step(refs[t], g, o, step);
    }
    opt.step(s);
  }
  EXPECT_EQ(opt.step_count(s), 100u);
  double worst = 0;
  for (std::size_t t = 0; t < params.size(); ++t) {
    const auto truth = check_master ? as_floats(opt.master(t), s) : as_floats(params[t], s);
    for (std::size_t i = 0; i < truth.size(); ++i) {
      worst = std::max(worst, std::fabs(truth[i] - refs[t].p[i]) / std::max(1.0, std::fabs(refs[t].p[i])));
    }
    if (check_master) {  // the model's weights are the master rounded to their dtype
      gc::Buffer rounded(truth.size(), param_dtype, d);
      upload_floats(rounded, truth, s);
      EXPECT_EQ(download<std::uint16_t>(rounded, s), download<std::uint16_t>(params[t], s));
    }
  }
  return worst;
}
}  // namespace

TEST_P(AmpTest, FusedSgdMatchesTorchOptimOver100Steps) {
  gc::SgdOptions o;
  o.lr = 0.01f;
  o.momentum = 0.9f;
  o.dampening = 0.1f;
  o.weight_decay = 1e-2f;
  EXPECT_LT((run_against_reference<gc::FusedSGD>(device(), o, ref_sgd, gc::DType::float32, false)), 2e-5);
  o.dampening = 0.0f;
  o.nesterov = true;
  EXPECT_LT((run_against_reference<gc::FusedSGD>(device(), o, ref_sgd, gc::DType::float32, false)), 2e-5);
  gc::SgdOptions plain;
  plain.lr = 0.05f;
  EXPECT_LT((run_against_reference<gc::FusedSGD>(device(), plain, ref_sgd, gc::DType::float32, false)), 2e-5);
}

TEST_P(AmpTest, FusedAdamAndAdamWMatchTorchOptimOver100Steps) {
  gc::AdamOptions adam;
  adam.weight_decay = 1e-2f;
  EXPECT_LT((run_against_reference<gc::FusedAdam>(device(), adam, ref_adam, gc::DType::float32, false)), 2e-5);
  gc::AdamOptions adamw = gc::AdamOptions::adamw();
  adamw.amsgrad = true;
  EXPECT_LT((run_against_reference<gc::FusedAdam>(device(), adamw, ref_adam, gc::DType::float32, false)), 2e-5);
}

TEST_P(AmpTest, MasterWeightsTakeTheUpdateInFp32AndRoundIntoTheModel) {
  gc::AdamOptions adamw = gc::AdamOptions::adamw();
  for (auto dtype : {gc::DType::float16, gc::DType::bfloat16}) {
    EXPECT_LT((run_against_reference<gc::FusedAdam>(device(), adamw, ref_adam, dtype, true)), 2e-5);
  }
  gc::SgdOptions sgd;
  sgd.momentum = 0.9f;
  EXPECT_LT((run_against_reference<gc::FusedSGD>(device(), sgd, ref_sgd, gc::DType::float16, true)), 2e-5);
}

TEST_P(AmpTest, SkippedStepChangesNothing) {
  gc::Stream s(device());
  gc::Buffer w = upload(std::vector<float>(3000, 0.5f), device(), s);
  gc::Buffer g = upload(std::vector<float>(3000, 0.25f), device(), s, gc::DType::float32);
  gc::Buffer w16(3000, gc::DType::float16, device());
  gc::Buffer g16(3000, gc::DType::float16, device());
  upload_floats(w16, std::vector<float>(3000, 0.5f), s);
  upload_floats(g16, std::vector<float>(3000, 0.25f), s);
  gc::AdamOptions o = gc::AdamOptions::adamw();
  o.amsgrad = true;
  gc::FusedAdam adam({{w, g}, {w16, g16}}, o, s);
  gc::LossScaler scaler(device(), s);
  adam.step(s, &scaler);  // one real step so moments are non-zero
  scaler.update(s);
  auto snapshot = [&] {
    std::vector<std::vector<float>> v;
    for (gc::BufferView b : {gc::BufferView(w), gc::BufferView(w16), adam.exp_avg(0), adam.exp_avg_sq(1),
                             adam.max_exp_avg_sq(0), adam.master(1)}) {
      v.push_back(as_floats(b, s));
    }
    return v;
  };
  const auto before = snapshot();
  upload_floats(g16, std::vector<float>(3000, std::numeric_limits<float>::infinity()), s);
  scaler.unscale({g, g16}, s);
  adam.step(s, &scaler);  // skipped on the device: no host synchronisation decided it
  EXPECT_EQ(snapshot(), before);
  EXPECT_EQ(adam.step_count(s), 1u);
  scaler.update(s);
  EXPECT_EQ(scaler.state(s).scale, 32768.0f);
}

// Enqueued work holds what it touches: an optimizer and a scaler destroyed while their work is
// queued (behind a gate) still run it into live memory, and the step count is an integer.
TEST_P(AmpTest, OptimizerAndScalerDroppedWithWorkQueuedStillRunIt) {
  gc::Stream s(device());
  gc::Buffer w = upload(std::vector<float>(5000, 1.0f), device(), s);
  gc::Buffer g = upload(std::vector<float>(5000, 0.5f), device(), s, gc::DType::float32);
  std::promise<void> gate;
  std::shared_future<void> open = gate.get_future().share();
  gc::Stream other(device());  // the state lives on another stream than the work (and outlives it)
  {
    gc::SgdOptions o;
    o.lr = 0.5f;
    o.momentum = 0.9f;
    auto sgd = std::make_unique<gc::FusedSGD>(std::vector<gc::ParamGrad>{{w, g}}, o, other);
    auto scaler = std::make_unique<gc::LossScaler>(device(), other);
    other.synchronize();
    gc::launch_host_func(s, [open] { open.wait(); });
    scaler->unscale({g}, s);
    sgd->step(s, scaler.get());
    scaler->update(s);
    sgd.reset();
    scaler.reset();
  }
  gate.set_value();
  s.synchronize();
  // g was unscaled by 65536, then one SGD step: w = 1 - 0.5 * g / 65536.
  const float expect = 1.0f - 0.5f * (0.5f / 65536.0f);
  for (float v : as_floats(w, s)) ASSERT_EQ(v, expect);
}

// The same memory twice in one fused pass would be updated twice: refused before any work.
TEST_P(AmpTest, DuplicateOrAliasedTensorsAreRejected) {
  gc::Stream s(device());
  gc::Buffer a = upload(std::vector<float>(100, 1.0f), device(), s);
  gc::Buffer b = upload(std::vector<float>(100, 2.0f), device(), s);
  gc::LossScaler scaler(device(), s);
  auto message = [](auto f) {
    try {
      f();
    } catch (const gc::InvalidArgument& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  EXPECT_NE(message([&] { scaler.unscale({a, b, a}, s); }).find("grads[2]: overlaps grads[0]"), std::string::npos);
  EXPECT_NE(message([&] {
              scaler.unscale({a.view().slice(0, 60), a.view().slice(50, 50)}, s);
            }).find("overlaps"),
            std::string::npos);
  EXPECT_NE(message([&] {
              gc::FusedSGD({{a, a}}, {}, s);
            }).find("params[0].grad: overlaps params[0].param"),
            std::string::npos);
  // Listed twice: whichever of its tensors sorts first in memory is named, always with params[1].
  const std::string twice = message([&] { gc::FusedAdam({{a, b}, {a, b}}, {}, s); });
  EXPECT_TRUE(twice.find("params[1].param: overlaps params[0].param") != std::string::npos ||
              twice.find("params[1].grad: overlaps params[0].grad") != std::string::npos)
      << twice;
  EXPECT_NE(message([&] { (void)gc::global_norm({a, a}, s); }).find("tensors[1]"), std::string::npos);
  scaler.unscale({a.view().slice(0, 50), a.view().slice(50, 50), b}, s);  // adjacent is fine
  for (float v : as_floats(b, s)) ASSERT_EQ(v, 2.0f / 65536.0f);
}

TEST_P(AmpTest, StepCountIsAnIntegerPastTwoToThe24) {
  gc::Stream s(device());
  gc::Buffer w = upload(std::vector<float>(10, 1.0f), device(), s);
  gc::Buffer g = upload(std::vector<float>(10, 0.0f), device(), s, gc::DType::float32);
  gc::FusedAdam adam({{w, g}}, gc::AdamOptions::adamw(), s);
  const std::size_t big = (std::size_t{1} << 25) + 1;  // not a float
  adam.load_step_count(big, s);
  EXPECT_EQ(adam.step_count(s), big);
  adam.step(s);
  EXPECT_EQ(adam.step_count(s), big + 1);  // a float count would stay at 2^25
}

// Clipping multiplies every gradient by the coefficient min(max_norm / (norm + 1e-6), 1) computed
// in fp32 from the norm it returns, each product rounded once into the gradient's dtype: in
// launches run in place and split over the host's cores.
TEST_P(AmpTest, ClippingScalesEveryDtypeByTheCoefficientRoundedOnce) {
  gc::Stream s(device());
  std::mt19937 rng(4);
  std::normal_distribution<float> normal(0.0f, 30.0f);
  for (auto dtype : {gc::DType::float32, gc::DType::float16, gc::DType::bfloat16}) {
    for (std::size_t n : {1000u, 300001u}) {
      std::vector<float> v(n);
      for (auto& x : v) x = normal(rng);
      gc::Buffer grads(n, dtype, device());
      upload_floats(grads, v, s);
      v = as_floats(grads, s);  // what the dtype holds
      gc::Buffer norm = gc::clip_grad_norm({grads}, 3.0f, s);
      const float coef = 3.0f / (download<float>(norm, s)[0] + 1e-6f);
      ASSERT_LT(coef, 1.0f);
      std::vector<float> scaled(v);
      for (auto& x : scaled) x = x * coef;
      gc::Buffer expect(n, dtype, device());
      upload_floats(expect, scaled, s);
      if (dtype == gc::DType::float32) {
        EXPECT_EQ(download<std::uint32_t>(grads, s), download<std::uint32_t>(expect, s)) << "n=" << n;
      } else {
        EXPECT_EQ(download<std::uint16_t>(grads, s), download<std::uint16_t>(expect, s))
            << gc::dtype_name(dtype) << " n=" << n;
      }
    }
  }
}

TEST_P(AmpTest, ClipGradNormMatchesTorch) {
  gc::Stream s(device());
  std::vector<float> a(70000), b(123);
  std::mt19937 rng(2);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  double sq = 0;
  for (auto* v : {&a, &b}) {
    for (auto& x : *v) {
      x = normal(rng);
      sq += double(x) * x;
    }
  }
  gc::Buffer ga = upload(a, device(), s), gb = upload(b, device(), s);
  const double norm = std::sqrt(sq);
  gc::Buffer total = gc::clip_grad_norm({ga, gb}, 10.0f, s);
  EXPECT_NEAR(download<float>(total, s)[0], norm, norm * 1e-5);
  const double coef = 10.0 / (norm + 1e-6);
  const auto clipped = download<float>(ga, s);
  for (std::size_t i = 0; i < a.size(); i += 997)
    EXPECT_NEAR(clipped[i], a[i] * coef, 1e-6 + std::fabs(a[i] * coef) * 1e-6);
  EXPECT_NEAR(download<float>(gc::global_norm({ga, gb}, s), s)[0], 10.0, 1e-4);
  // Already small enough: unchanged (coefficient clamped to 1).
  gc::clip_grad_norm({ga, gb}, 100.0f, s);
  EXPECT_EQ(download<float>(ga, s), clipped);
  // A tensor it cannot take: a typed error naming it, before anything is allocated or enqueued.
  gc::Buffer ints(3, gc::DType::int32, device());
  s.synchronize();
  for (auto call : {+[](const std::vector<gc::BufferView>&t, gc::StreamView st) { gc::clip_grad_norm(t, 1.0f, st); },
                    +[](const std::vector<gc::BufferView>&t, gc::StreamView st) { gc::global_norm(t, st); }}) {
    try {
      call({ga, ints}, s);
      FAIL() << "no error";
    } catch (const gc::InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("tensors[1]"), std::string::npos) << e.what();
    }
    EXPECT_TRUE(s.query());
  }
  EXPECT_EQ(download<float>(ga, s), clipped);
}

TEST_P(AmpTest, BadOptimizerInputIsATypedErrorAndChangesNothing) {
  gc::Stream s(device());
  gc::Buffer w(10, gc::DType::float32, device()), g(10, gc::DType::float32, device()),
      short_g(9, gc::DType::float32, device());
  gc::Buffer ints(10, gc::DType::int32, device());
  EXPECT_THROW(gc::FusedSGD({{w, short_g}}, {}, s), gc::InvalidArgument);
  EXPECT_THROW(gc::FusedSGD({{ints, g}}, {}, s), gc::InvalidArgument);
  EXPECT_THROW(gc::FusedSGD({}, {}, s), gc::InvalidArgument);
  gc::SgdOptions bad_nesterov;
  bad_nesterov.nesterov = true;
  EXPECT_THROW(gc::FusedSGD({{w, g}}, bad_nesterov, s), gc::InvalidArgument);
  gc::AdamOptions bad_beta;
  bad_beta.beta1 = 1.0f;
  EXPECT_THROW(gc::FusedAdam({{w, g}}, bad_beta, s), gc::InvalidArgument);
  gc::AdamOptions bad_lr;
  bad_lr.lr = -1.0f;
  EXPECT_THROW(gc::FusedAdam({{w, g}}, bad_lr, s), gc::InvalidArgument);
  gc::FusedSGD sgd({{w, g}}, {}, s);
  EXPECT_THROW(sgd.set_lr(std::nanf("")), gc::InvalidArgument);
  EXPECT_EQ(sgd.options().lr, 0.01f);
  if (device().is_cuda()) {
    gc::Buffer host_w(10, gc::DType::float32, gc::Device::host());
    EXPECT_THROW(gc::FusedSGD({{host_w, g}}, {}, s), gc::InvalidArgument);  // another device
    gc::Stream host_stream;
    gc::LossScaler host_scaler(gc::Device::host(), host_stream);
    EXPECT_THROW(sgd.step(s, &host_scaler), gc::InvalidArgument);
  }
}

// A framework that allocates new gradient tensors every backward (torch with set_to_none) passes
// them with set_grads: the trajectory is the one of an optimizer bound to fixed gradients. Options
// changed between steps (a scheduler's) take effect at the next step.
TEST_P(AmpTest, NewGradientsAndOptionsBetweenStepsFollowTheFixedBindingsTrajectory) {
  gc::Stream s(device());
  const std::size_t n = 257;
  std::vector<float> w0(n), g_values(n);
  for (std::size_t i = 0; i < n; ++i) w0[i] = 0.01f * static_cast<float>(i % 17) - 0.05f;
  gc::Buffer fixed_w = upload(w0, device(), s), fixed_g(n, gc::DType::float32, device());
  gc::Buffer moving_w = upload(w0, device(), s), first_g(n, gc::DType::float32, device());
  gc::AdamOptions o = gc::AdamOptions::adamw();
  gc::FusedAdam fixed({{fixed_w, fixed_g}}, o, s), moving({{moving_w, first_g}}, o, s);
  std::vector<gc::Buffer> fresh;  // a new gradient tensor each step, kept until the end
  for (int step = 0; step < 6; ++step) {
    for (std::size_t i = 0; i < n; ++i) g_values[i] = std::sin(0.1f * static_cast<float>(i + step * 31));
    upload_floats(fixed_g, g_values, s);
    fresh.push_back(upload(g_values, device(), s));
    moving.set_grads({fresh.back()}, s);
    if (step == 3) {  // a scheduler: lr, betas and weight decay change for the later steps
      o.lr = 3e-3f;
      o.beta1 = 0.8f;
      o.weight_decay = 0.1f;
      fixed.set_options(o);
      moving.set_options(o);
    }
    fixed.step(s);
    moving.step(s);
  }
  EXPECT_EQ(as_floats(moving_w, s), as_floats(fixed_w, s));
  EXPECT_NE(as_floats(moving_w, s), w0);
  EXPECT_EQ(moving.options().beta1, 0.8f);

  // Bad gradients and options are typed errors naming what is wrong, and change nothing.
  gc::Buffer short_g(n - 1, gc::DType::float32, device()), ints(n, gc::DType::int32, device());
  const auto before = as_floats(moving_w, s);
  auto expect_invalid = [](auto&& call, const std::string& names) {
    try {
      call();
      ADD_FAILURE() << "no error for " << names;
    } catch (const gc::InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(names), std::string::npos) << e.what();
    }
  };
  expect_invalid([&] { moving.set_grads({short_g}, s); }, "grads[0]: 256 elements");
  expect_invalid([&] { moving.set_grads({ints}, s); }, "grads[0]: dtype int32");
  expect_invalid([&] { moving.set_grads({}, s); }, "grads: 0 gradients for 1 parameters");
  expect_invalid([&] { moving.set_grads({moving_w}, s); }, "grads[0]");  // the parameter itself
  gc::AdamOptions ams = o;
  ams.amsgrad = true;
  expect_invalid([&] { moving.set_options(ams); }, "options.amsgrad");
  gc::AdamOptions bad = o;
  bad.beta2 = 1.0f;
  expect_invalid([&] { moving.set_options(bad); }, "beta1/beta2");
  EXPECT_EQ(moving.options().beta2, o.beta2);
  gc::SgdOptions with_momentum;
  with_momentum.momentum = 0.9f;
  gc::FusedSGD sgd({{moving_w, fresh.back()}}, {}, s);
  expect_invalid([&] { sgd.set_options(with_momentum); }, "options.momentum");
  moving.step(s);  // the last good gradient is still the one bound
  fixed.step(s);
  EXPECT_EQ(as_floats(moving_w, s), as_floats(fixed_w, s));
  EXPECT_NE(as_floats(moving_w, s), before);
}

// A fp16 model whose scaled gradients overflow at the initial scale: the scaler backs off,
// the overflowing steps are skipped, and it trains to its fp32 twin's loss.
TEST_P(AmpTest, Fp16ModelTrainsToItsFp32TwinsLossBecauseTheScalerBacksOff) {
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
  upload_floats(w16, std::vector<float>(k, 0.0f), s);
  gc::FusedSGD model({{w16, g16}}, o, s);
  gc::LossScaler scaler(device(), s);
  std::vector<float> grad(k);
  double twin_loss = 0, model_loss = 0;
  int skipped = 0;
  for (int step = 0; step < 300; ++step) {
    twin_loss = loss_and_grad(as_floats(w32, s), grad, 1.0f);
    upload_floats(g32, grad, s);
    twin.step(s);
    const float scale = scaler.state(s).scale;  // read only to emulate a scaled backward here
    model_loss = loss_and_grad(as_floats(w16, s), grad, scale);
    upload_floats(g16, grad, s);  // fp16 gradients: inf where scale * grad > 65504
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

GPUCLOUD_INSTANTIATE_ON_EVERY_DEVICE(AmpTest);

namespace {
// A host stream held busy until open(): work enqueued meanwhile waits its turn behind it.
struct Gate {
  std::promise<void> release;
  std::shared_future<void> opened = release.get_future().share();
  void close_on(gc::StreamView s) {
    gc::launch_host_func(s, [f = opened] { f.wait(); });
  }
  void open() { release.set_value(); }
};

// One AdamW step with a scaler (unscale, clip, step, update) over copies of @p init, on @p s.
struct SmallStep {
  std::vector<gc::Buffer> w, g;
  gc::FusedAdam adam;
  gc::LossScaler scaler;
  static std::vector<gc::ParamGrad> bind(std::vector<gc::Buffer>& w, std::vector<gc::Buffer>& g) {
    std::vector<gc::ParamGrad> pg;
    for (std::size_t i = 0; i < w.size(); ++i) pg.push_back({w[i], g[i]});
    return pg;
  }
  SmallStep(const std::vector<std::vector<float>>& init, gc::StreamView s)
      : w(uploads(init, s)),
        g(uploads(init, s)),
        adam(bind(w, g), gc::AdamOptions::adamw(), s),
        scaler(gc::Device::host(), s) {
    s.synchronize();
  }
  static std::vector<gc::Buffer> uploads(const std::vector<std::vector<float>>& v, gc::StreamView s) {
    std::vector<gc::Buffer> out;
    for (const auto& x : v) out.push_back(upload(x, gc::Device::host(), s));
    return out;
  }
  void run(gc::StreamView s) {
    std::vector<gc::BufferView> grads(g.begin(), g.end());
    scaler.unscale(grads, s);
    gc::clip_grad_norm(grads, 1e-6f, s);
    adam.step(s, &scaler);
    scaler.update(s);
  }
};
}  // namespace

// A small step's every launch (unscale, the norm's sums, clipping, the update, the scaler's
// bookkeeping) runs on the caller when the host stream is idle: done when the calls return, with
// the results the same calls give queued behind other work.
TEST(AmpHostInPlace, ASmallStepOnAnIdleStreamHasRunWhenTheCallsReturnAndMatchesTheQueuedStep) {
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<std::vector<float>> init;
  for (std::size_t n : {300u, 4096u, 17u}) {
    init.emplace_back(n);
    for (auto& x : init.back()) x = normal(rng) * 65536.0f;
  }
  gc::Stream s;
  SmallStep idle(init, s), queued(init, s);
  idle.run(s);
  EXPECT_TRUE(s.query());
  Gate gate;
  gate.close_on(s);
  queued.run(s);
  EXPECT_FALSE(s.query());  // behind the gate: nothing of it ran yet
  gate.open();
  s.synchronize();
  EXPECT_EQ(idle.adam.step_count(s), 1u);
  for (std::size_t i = 0; i < init.size(); ++i) {
    EXPECT_EQ(download<float>(idle.w[i], s), download<float>(queued.w[i], s)) << "tensor " << i;
    EXPECT_NE(download<float>(idle.w[i], s), init[i]) << "tensor " << i;
    EXPECT_EQ(download<float>(idle.adam.exp_avg_sq(i), s), download<float>(queued.adam.exp_avg_sq(i), s));
  }
}

// Launches of more than 2 x 128Ki elements are split over the host's cores by blocks: the same
// bits as launches small enough to run on one thread, and an overflow in any block is seen.
TEST(AmpHostParallel, ALargeLaunchSplitOverCoresMatchesSmallLaunchesBitForBit) {
  gc::Stream s;
  std::mt19937 rng(9);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  constexpr std::size_t kTensors = 4, kSize = 200001;  // each < 2 x 128Ki: one tensor's launch is serial
  std::vector<gc::Buffer> w_all, g_all, w_one, g_one;
  for (std::size_t t = 0; t < kTensors; ++t) {
    std::vector<float> w(kSize), g(kSize);
    for (auto& x : w) x = normal(rng);
    for (auto& x : g) x = normal(rng) * 1024.0f;
    w_all.push_back(upload(w, gc::Device::host(), s));
    w_one.push_back(upload(w, gc::Device::host(), s));
    g_all.push_back(upload(g, gc::Device::host(), s));
    g_one.push_back(upload(g, gc::Device::host(), s));
  }
  std::vector<gc::ParamGrad> all;
  for (std::size_t t = 0; t < kTensors; ++t) all.push_back({w_all[t], g_all[t]});
  gc::AdamOptions o = gc::AdamOptions::adamw();
  o.amsgrad = true;
  gc::SgdOptions so;
  so.momentum = 0.9f;
  so.nesterov = true;
  gc::FusedAdam adam_all(all, o, s);
  gc::FusedSGD sgd_all(all, so, s);
  std::vector<std::unique_ptr<gc::FusedAdam>> adam_one;
  std::vector<std::unique_ptr<gc::FusedSGD>> sgd_one;
  for (std::size_t t = 0; t < kTensors; ++t) {
    adam_one.push_back(std::make_unique<gc::FusedAdam>(std::vector<gc::ParamGrad>{{w_one[t], g_one[t]}}, o, s));
    sgd_one.push_back(std::make_unique<gc::FusedSGD>(std::vector<gc::ParamGrad>{{w_one[t], g_one[t]}}, so, s));
  }
  gc::LossScaler scaler_all(gc::Device::host(), s), scaler_one(gc::Device::host(), s);
  std::vector<gc::BufferView> grads_all(g_all.begin(), g_all.end());
  for (int step = 0; step < 3; ++step) {
    EXPECT_EQ(scaler_all.unscale(grads_all, s), 1);  // one launch over all four tensors
    adam_all.step(s, &scaler_all);
    sgd_all.step(s, &scaler_all);
    for (std::size_t t = 0; t < kTensors; ++t) {
      scaler_one.unscale({g_one[t]}, s);
      adam_one[t]->step(s, &scaler_one);
      sgd_one[t]->step(s, &scaler_one);
    }
  }
  for (std::size_t t = 0; t < kTensors; ++t) {
    EXPECT_EQ(download<float>(w_all[t], s), download<float>(w_one[t], s)) << "tensor " << t;
    EXPECT_EQ(download<float>(g_all[t], s), download<float>(g_one[t], s)) << "tensor " << t;
    EXPECT_EQ(download<float>(adam_all.max_exp_avg_sq(t), s), download<float>(adam_one[t]->max_exp_avg_sq(0), s));
  }
  EXPECT_FALSE(scaler_all.state(s).found_inf);
  // A NaN in the last element of the last tensor (the last block of the split) is found.
  std::vector<float> g = download<float>(g_all.back(), s);
  g.back() = std::nanf("");
  gc::copy(g_all.back(), upload(g, gc::Device::host(), s), s);
  scaler_all.unscale(grads_all, s);
  EXPECT_TRUE(scaler_all.state(s).found_inf);
}
