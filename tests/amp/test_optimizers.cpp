// The fused optimizers on every device: SGD, Adam and AdamW against float64 re-implementations
// of torch.optim's formulas, fp32 master weights, skipped steps, gradient clipping, misuse, and
// the host backend's in-place and parallel launches.
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
// torch.optim reference in float64, one parameter tensor.
struct RefParam {
  std::vector<double> p, buf, m, v, vmax;
};

void ref_sgd(RefParam& r, const std::vector<float>& g, const gc::SgdOptions& o, int step) {
  for (std::size_t i = 0; i < r.p.size(); ++i) {
    double d = o.maximize ? -g[i] : g[i];
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
    double d = o.maximize ? -g[i] : g[i];
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
    gc::testing::write(params.back(), init, s);
    grads.emplace_back(n, gc::DType::float32, d);
    const auto widened = gc::testing::read(params.back(), s);  // the reference starts where the model does
    refs.push_back({std::vector<double>(widened.begin(), widened.end()), std::vector<double>(n), std::vector<double>(n),
                    std::vector<double>(n), std::vector<double>(n)});
    pg.push_back({params.back(), grads.back()});
  }
  Optimizer opt(pg, o, s);
  for (int step = 1; step <= 100; ++step) {
    for (std::size_t t = 0; t < params.size(); ++t) {
      std::vector<float> g(sizes[t]);
      for (auto& x : g) x = normal(rng);
      gc::testing::write(grads[t], g, s);
      ref_step(refs[t], g, o, step);
    }
    opt.step(s);
  }
  EXPECT_EQ(opt.step_count(s), 100u);
  double worst = 0;
  for (std::size_t t = 0; t < params.size(); ++t) {
    const auto truth = check_master ? gc::testing::read(opt.master(t), s) : gc::testing::read(params[t], s);
    for (std::size_t i = 0; i < truth.size(); ++i) {
      worst = std::max(worst, std::fabs(truth[i] - refs[t].p[i]) / std::max(1.0, std::fabs(refs[t].p[i])));
    }
    if (check_master) {  // the model's weights are the master rounded to their dtype
      gc::Buffer rounded(truth.size(), param_dtype, d);
      gc::testing::write(rounded, truth, s);
      EXPECT_EQ(download<std::uint16_t>(rounded, s), download<std::uint16_t>(params[t], s));
    }
  }
  return worst;
}
}  // namespace

class OptimizerTest : public gc::testing::OnEveryDevice {};

TEST_P(OptimizerTest, FusedSgdMatchesTorchOptimOver100Steps) {
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
  o.maximize = true;  // torch's maximize: the gradient negated before weight decay and momentum
  EXPECT_LT((run_against_reference<gc::FusedSGD>(device(), o, ref_sgd, gc::DType::float32, false)), 2e-5);
}

TEST_P(OptimizerTest, FusedAdamAndAdamWMatchTorchOptimOver100Steps) {
  gc::AdamOptions adam;
  adam.weight_decay = 1e-2f;
  EXPECT_LT((run_against_reference<gc::FusedAdam>(device(), adam, ref_adam, gc::DType::float32, false)), 2e-5);
  gc::AdamOptions adamw = gc::AdamOptions::adamw();
  adamw.amsgrad = true;
  EXPECT_LT((run_against_reference<gc::FusedAdam>(device(), adamw, ref_adam, gc::DType::float32, false)), 2e-5);
  adam.maximize = adamw.maximize = true;  // torch's maximize: the gradient negated before weight decay
  EXPECT_LT((run_against_reference<gc::FusedAdam>(device(), adam, ref_adam, gc::DType::float32, false)), 2e-5);
  EXPECT_LT((run_against_reference<gc::FusedAdam>(device(), adamw, ref_adam, gc::DType::float32, false)), 2e-5);
}

TEST_P(OptimizerTest, MasterWeightsTakeTheUpdateInFp32AndRoundIntoTheModel) {
  gc::AdamOptions adamw = gc::AdamOptions::adamw();
  for (auto dtype : {gc::DType::float16, gc::DType::bfloat16}) {
    EXPECT_LT((run_against_reference<gc::FusedAdam>(device(), adamw, ref_adam, dtype, true)), 2e-5);
  }
  gc::SgdOptions sgd;
  sgd.momentum = 0.9f;
  EXPECT_LT((run_against_reference<gc::FusedSGD>(device(), sgd, ref_sgd, gc::DType::float16, true)), 2e-5);
}

TEST_P(OptimizerTest, SkippedStepChangesNothing) {
  gc::Stream s(device());
  gc::Buffer w = upload(std::vector<float>(3000, 0.5f), device(), s);
  gc::Buffer g = upload(std::vector<float>(3000, 0.25f), device(), s, gc::DType::float32);
  gc::Buffer w16(3000, gc::DType::float16, device());
  gc::Buffer g16(3000, gc::DType::float16, device());
  gc::testing::write(w16, std::vector<float>(3000, 0.5f), s);
  gc::testing::write(g16, std::vector<float>(3000, 0.25f), s);
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
      v.push_back(gc::testing::read(b, s));
    }
    return v;
  };
  const auto before = snapshot();
  gc::testing::write(g16, std::vector<float>(3000, std::numeric_limits<float>::infinity()), s);
  scaler.unscale({g, g16}, s);
  adam.step(s, &scaler);  // skipped on the device: no host synchronisation decided it
  EXPECT_EQ(snapshot(), before);
  EXPECT_EQ(adam.step_count(s), 1u);
  scaler.update(s);
  EXPECT_EQ(scaler.state(s).scale, 32768.0f);
}

// Enqueued work holds what it touches: an optimizer and a scaler destroyed while their work is
// queued (behind a gate) still run it into live memory, and the step count is an integer.
TEST_P(OptimizerTest, OptimizerAndScalerDroppedWithWorkQueuedStillRunIt) {
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
  for (float v : gc::testing::read(w, s)) ASSERT_EQ(v, expect);
}

// The same memory twice in one fused pass would be updated twice: refused before any work.
TEST_P(OptimizerTest, DuplicateOrAliasedTensorsAreRejected) {
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
  for (float v : gc::testing::read(b, s)) ASSERT_EQ(v, 2.0f / 65536.0f);
}

TEST_P(OptimizerTest, StepCountIsAnIntegerPastTwoToThe24) {
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
TEST_P(OptimizerTest, ClippingScalesEveryDtypeByTheCoefficientRoundedOnce) {
  gc::Stream s(device());
  std::mt19937 rng(4);
  std::normal_distribution<float> normal(0.0f, 30.0f);
  for (auto dtype : {gc::DType::float32, gc::DType::float16, gc::DType::bfloat16}) {
    for (std::size_t n : {1000u, 300001u}) {
      std::vector<float> v(n);
      for (auto& x : v) x = normal(rng);
      gc::Buffer grads(n, dtype, device());
      gc::testing::write(grads, v, s);
      v = gc::testing::read(grads, s);  // what the dtype holds
      gc::Buffer norm = gc::clip_grad_norm({grads}, 3.0f, s);
      const float coef = 3.0f / (download<float>(norm, s)[0] + 1e-6f);
      ASSERT_LT(coef, 1.0f);
      std::vector<float> scaled(v);
      for (auto& x : scaled) x = x * coef;
      gc::Buffer expect(n, dtype, device());
      gc::testing::write(expect, scaled, s);
      if (dtype == gc::DType::float32) {
        EXPECT_EQ(download<std::uint32_t>(grads, s), download<std::uint32_t>(expect, s)) << "n=" << n;
      } else {
        EXPECT_EQ(download<std::uint16_t>(grads, s), download<std::uint16_t>(expect, s))
            << gc::dtype_name(dtype) << " n=" << n;
      }
    }
  }
}

TEST_P(OptimizerTest, ClipGradNormMatchesTorch) {
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

TEST_P(OptimizerTest, BadOptimizerInputIsATypedErrorAndChangesNothing) {
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
TEST_P(OptimizerTest, NewGradientsAndOptionsBetweenStepsFollowTheFixedBindingsTrajectory) {
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
    gc::testing::write(fixed_g, g_values, s);
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
  EXPECT_EQ(gc::testing::read(moving_w, s), gc::testing::read(fixed_w, s));
  EXPECT_NE(gc::testing::read(moving_w, s), w0);
  EXPECT_EQ(moving.options().beta1, 0.8f);

  // Bad gradients and options are typed errors naming what is wrong, and change nothing.
  gc::Buffer short_g(n - 1, gc::DType::float32, device()), ints(n, gc::DType::int32, device());
  const auto before = gc::testing::read(moving_w, s);
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
  EXPECT_EQ(gc::testing::read(moving_w, s), gc::testing::read(fixed_w, s));
  EXPECT_NE(gc::testing::read(moving_w, s), before);
}

// A fp16 model whose scaled gradients overflow at the initial scale: the scaler backs off,
// the overflowing steps are skipped, and it trains to its fp32 twin's loss.

GPUCLOUD_INSTANTIATE_ON_EVERY_DEVICE(OptimizerTest);

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
