// Mixed-precision training of a small convolutional network: the convolutional twin of train_mlp.
// Batches streamed by the Prefetcher, two convolutions (fused bias+ReLU) forward and their
// backward-data / backward-filter passes, a GEMM head, the MSE loss with a loss-scaled gradient,
// dynamic loss scaling with skipped steps logged, fp32 master weights and fused AdamW.
//
// The task: 12 x 12 images holding one line (horizontal, vertical, diagonal or anti-diagonal, at a
// random offset) in Gaussian noise; the class is the line's orientation. The lines are separable
// by 3 x 3 filters, so the achievable accuracy is 100 %; the run must reach --target (95 %) on 1024
// held-out images. Every image is a pure function of (step, index), as in train_mlp.
//
//   train_cnn [--steps 600] [--batch 64] [--dtype fp16|bf16|fp32] [--lr 3e-3] [--log-every 100]
//             [--checkpoint-dir DIR] [--checkpoint-every 200] [--keep-last 3] [--resume] [--metrics-port P]
//             [--noise 0.35] [--device host|cuda] [--target 0.95] [--overflow-at 300]
//
// Layout NHWC throughout (the tensor-core layout; a conv output is then a (pixels x channels)
// matrix, whose bias gradient is bias_grad over its rows):
//   x (n,12,12,1) -conv 3x3 pad 1, 8 filters, bias+ReLU-> h1 (n,12,12,8)
//     -conv 3x3 stride 2 pad 1, 16 filters, bias+ReLU-> h2 (n,6,6,16) = (n, 576)
//     -GEMM 576 x 4 + bias-> scores (n,4), MSE against the one-hot class.
#include <gpucloud/gpucloud.hpp>

#include "example_support.hpp"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace gc = gpucloud;
using examples::normal;
using examples::read_floats;
using examples::write_floats;

namespace {

constexpr int kSide = 12, kClasses = 4, kC1 = 8, kC2 = 16, kSide2 = 6, kFlat = kSide2 * kSide2 * kC2;
constexpr int kHeldOut = 1024;
constexpr std::uint64_t kHeldOutStep = 1u << 30;  // held-out images come from steps no run reaches

struct Options {
  int steps = 600, batch = 64, log_every = 100;
  int overflow_at = 300;  // a forced overflow: the step must be skipped and logged (-1: none)
  float lr = 3e-3f, noise = 0.35f;
  double target = 0.95;
  std::string dtype = "fp16", device = "host", checkpoint_dir;
  int checkpoint_every = 200, keep_last = 3;
  int metrics_port = -1;  // serve Prometheus metrics (0: a free port)
  bool resume = false;
};

Options parse(int argc, char** argv) {
  Options o;
  using examples::into;
  examples::parse_options(argc, argv, "train_cnn",
                          {{"--steps", into(o.steps)},
                           {"--batch", into(o.batch)},
                           {"--dtype", into(o.dtype)},
                           {"--lr", into(o.lr)},
                           {"--log-every", into(o.log_every)},
                           {"--noise", into(o.noise)},
                           {"--device", into(o.device)},
                           {"--overflow-at", into(o.overflow_at)},
                           {"--target", into(o.target)},
                           {"--checkpoint-dir", into(o.checkpoint_dir)},
                           {"--checkpoint-every", into(o.checkpoint_every)},
                           {"--keep-last", into(o.keep_last)},
                           {"--metrics-port", into(o.metrics_port)}},
                          {{"--resume", &o.resume}});
  using examples::require;
  constexpr const char* p = "train_cnn";
  require(o.steps >= 1, p, "--steps", "must be at least 1");
  require(o.batch >= 1, p, "--batch", "must be at least 1");
  require(o.log_every >= 1, p, "--log-every", "must be at least 1");
  require(o.lr > 0.0f, p, "--lr", "must be positive");
  require(o.noise >= 0.0f, p, "--noise", "must be a finite number >= 0");
  require(o.target > 0.0 && o.target <= 1.0, p, "--target", "an accuracy in (0, 1]");
  require(o.overflow_at >= -1, p, "--overflow-at", "a step, or -1 for none");
  require(o.checkpoint_every >= 1, p, "--checkpoint-every", "must be at least 1");
  require(o.keep_last >= 0, p, "--keep-last", "a count, or 0 to keep every checkpoint");
  require(o.metrics_port >= -1 && o.metrics_port <= 65535, p, "--metrics-port",
          "a port, 0 for a free one, -1 for none");
  require(!o.resume || !o.checkpoint_dir.empty(), p, "--resume", "needs --checkpoint-dir DIR");
  examples::require_one_of(o.dtype, {"fp16", "bf16", "fp32"}, p, "--dtype");
  return o;
}

// Image @p index of @p step: its class, and its pixels written into x (NHWC, one channel).
int make_image(std::uint64_t step, std::uint64_t index, float noise, gc::BufferView x, std::size_t at) {
  const int cls = static_cast<int>(std::fabs(normal(21, step, index, 0)) * 1000.0) % kClasses;
  const int offset = static_cast<int>(std::fabs(normal(21, step, index, 1)) * 1000.0) % kSide;
  for (int y = 0; y < kSide; ++y) {
    for (int z = 0; z < kSide; ++z) {
      const bool on = (cls == 0 && y == offset) || (cls == 1 && z == offset) ||
                      (cls == 2 && z == (y + offset) % kSide) || (cls == 3 && z == (offset - y + kSide) % kSide);
      const double v = (on ? 1.0 : 0.0) + noise * normal(22, step, index, static_cast<std::uint64_t>(y * kSide + z));
      examples::store(x, at + static_cast<std::size_t>(y * kSide + z), static_cast<float>(v));
    }
  }
  return cls;
}

// A batch of @p n images of @p step: x in the model dtype, one-hot targets in fp32, and labels.
gc::HostBatch make_batch(std::uint64_t step, int n, float noise, gc::DType dtype) {
  struct Owned {
    gc::Buffer x, y, labels;
  };
  auto o = std::make_shared<Owned>();
  const auto un = static_cast<std::size_t>(n);
  o->x = gc::Buffer(un * kSide * kSide, dtype, gc::Device::host(), gc::MemoryKind::pinned);
  o->y = gc::Buffer(un * kClasses, gc::DType::float32, gc::Device::host(), gc::MemoryKind::pinned);
  o->labels = gc::Buffer(un, gc::DType::int32, gc::Device::host(), gc::MemoryKind::pinned);
  for (std::size_t i = 0; i < un; ++i) {
    const int cls = make_image(step, i, noise, o->x, i * kSide * kSide);
    for (int c = 0; c < kClasses; ++c) o->y.data_as<float>()[i * kClasses + static_cast<std::size_t>(c)] = c == cls;
    o->labels.data_as<std::int32_t>()[i] = cls;
  }
  return gc::HostBatch{{o->x.view(), o->y.view(), o->labels.view()}, o};
}

gc::ConvArgs conv1(int n) {
  gc::ConvArgs a;
  a.n = n, a.c = 1, a.h = kSide, a.w = kSide, a.k = kC1, a.r = 3, a.s = 3, a.pad_h = 1, a.pad_w = 1;
  a.layout = gc::ConvLayout::nhwc;
  return a;
}

gc::ConvArgs conv2(int n) {
  gc::ConvArgs a;
  a.n = n, a.c = kC1, a.h = kSide, a.w = kSide, a.k = kC2, a.r = 3, a.s = 3, a.pad_h = 1, a.pad_w = 1;
  a.stride_h = a.stride_w = 2;
  a.layout = gc::ConvLayout::nhwc;
  return a;
}

struct Param {
  gc::Buffer w, dw;
};

}  // namespace

int main(int argc, char** argv) try {
  const Options o = parse(argc, argv);
  const gc::DType dtype = gc::dtype_from_name(o.dtype == "fp16"   ? "float16"
                                              : o.dtype == "bf16" ? "bfloat16"
                                                                  : "float32");
  const gc::Device dev = gc::Device::parse(o.device);
  gc::Stream s(dev);
  gc::MetricsMonitor monitor(dev);  // the device's load, for the progress lines and the summary
  // Prometheus metrics (docs/telemetry.md): the device and every step; a port that cannot be
  // served is reported and the training goes on.
  std::optional<gc::telemetry::Exporter> metrics;
  if (o.metrics_port >= 0) {
    try {
      gc::telemetry::ExporterOptions mo;
      mo.port = o.metrics_port;
      mo.labels = gc::telemetry::job_labels(gc::launch_info_from_environment());
      metrics.emplace(mo);
      metrics->watch(monitor);
      std::printf("metrics at http://%s:%d/metrics\n", mo.labels["node"].c_str(), metrics->port());
    } catch (const gc::Error& e) {
      std::printf("metrics not served (%s); training goes on\n", e.what());
    }
  }
  std::printf("train_cnn: %s, %s, batch %d, %d steps\n", dev.str().c_str(), gc::dtype_name(dtype), o.batch, o.steps);

  // Parameters (He initialisation), in backward order: W3, b3, W2, b2, W1, b1.
  const std::size_t sizes[] = {kFlat * kClasses, kClasses, kC2 * 9 * kC1, kC2, kC1 * 9, kC1};
  const double fan_in[] = {kFlat, 0, 9 * kC1, 0, 9, 0};  // 0: a bias, initialised to zero
  std::vector<Param> p;
  std::vector<gc::ParamGrad> params;
  std::vector<gc::BufferView> grads;
  for (std::size_t i = 0; i < 6; ++i) {
    std::vector<float> v(sizes[i], 0.0f);
    for (std::size_t j = 0; fan_in[i] > 0 && j < v.size(); ++j)
      v[j] = static_cast<float>(normal(5, i, 0, j) * std::sqrt(2.0 / fan_in[i]));
    p.push_back({gc::Buffer(sizes[i], dtype, dev), gc::Buffer(sizes[i], dtype, dev)});
    write_floats(p.back().w, v, s);
  }
  for (auto& q : p) {
    params.push_back({q.w, q.dw});
    grads.push_back(q.dw);
  }
  gc::BufferView w3 = p[0].w, b3 = p[1].w, w2 = p[2].w, b2 = p[3].w, w1 = p[4].w, b1 = p[5].w;
  gc::BufferView dw3 = p[0].dw, db3 = p[1].dw, dw2 = p[2].dw, db2 = p[3].dw, dw1 = p[4].dw, db1 = p[5].dw;
  gc::AdamOptions adam_options = gc::AdamOptions::adamw();
  adam_options.lr = o.lr;
  gc::FusedAdam adam(params, adam_options, s);
  gc::LossScalerOptions scaler_options;
  scaler_options.dynamic = dtype == gc::DType::float16;
  if (!scaler_options.dynamic) scaler_options.init_scale = 1.0f;
  gc::LossScaler scaler(dev, s, scaler_options);

  // Checkpoints: the weights and the optimizer's and scaler's state, saved in the background.
  gc::StateDict state;
  const char* names[] = {"head.weight", "head.bias", "conv2.weight", "conv2.bias", "conv1.weight", "conv1.bias"};
  for (std::size_t i = 0; i < 6; ++i) state[std::string("model.") + names[i]] = {p[i].w, {}};
  gc::merge_state(state, "optimizer.", adam.state_dict());
  gc::merge_state(state, "scaler.", scaler.state_dict());
  std::optional<gc::checkpoint::Checkpointer> checkpointer;
  if (!o.checkpoint_dir.empty()) {
    gc::checkpoint::Options co;
    co.keep_last = o.keep_last;
    checkpointer.emplace(o.checkpoint_dir, co);
  }
  int start = 0;
  if (o.resume) {
    if (const auto dir = gc::checkpoint::latest(o.checkpoint_dir)) {
      start = static_cast<int>(gc::checkpoint::load(*dir, state, s).step);
      adam.load_state_dict(gc::sub_state(state, "optimizer."), s);
      scaler.load_state_dict(gc::sub_state(state, "scaler."), s);
      std::printf("resumed from %s at step %d\n", dir->c_str(), start);
    } else {
      std::printf("no checkpoint in %s yet: starting from step 0\n", o.checkpoint_dir.c_str());
    }
  }

  const int n = o.batch;
  auto buffer = [&](std::size_t count, gc::DType t) { return gc::Buffer(count, t, dev); };
  const auto un = static_cast<std::size_t>(n);
  gc::Buffer h1 = buffer(un * kSide * kSide * kC1, dtype), dh1 = buffer(un * kSide * kSide * kC1, dtype);
  gc::Buffer h2 = buffer(un * kFlat, dtype), dh2 = buffer(un * kFlat, dtype);
  gc::Buffer scores = buffer(un * kClasses, gc::DType::float32), dscores = buffer(un * kClasses, dtype);
  gc::Buffer loss = buffer(1, gc::DType::float32), b3f = buffer(kClasses, gc::DType::float32);

  // Forward through the network for a batch of n images in x; scores are fp32.
  auto forward = [&](gc::BufferView x) {
    gc::ConvArgs a1 = conv1(n), a2 = conv2(n);
    a1.epilogue = a2.epilogue = gc::Epilogue::bias_relu;
    a1.bias = b1;
    a2.bias = b2;
    gc::conv2d_forward(h1, x, w1, a1, s);
    gc::conv2d_forward(h2, h1, w2, a2, s);
    gc::GemmArgs head;
    head.m = n, head.n = kClasses, head.k = kFlat, head.epilogue = gc::Epilogue::bias;
    gc::cast(b3f, b3, s);  // the fp32 output's bias is given in fp32
    head.bias = b3f;
    gc::gemm(scores, h2, w3, head, s);
  };
  auto gemm = [&](gc::BufferView c, gc::BufferView a, gc::BufferView b, int m, int nn, int k, bool ta, bool tb) {
    gc::GemmArgs g;
    g.m = m, g.n = nn, g.k = k;
    g.trans_a = ta ? gc::Transpose::transpose : gc::Transpose::none;
    g.trans_b = tb ? gc::Transpose::transpose : gc::Transpose::none;
    gc::gemm(c, a, b, g, s);
  };

  int produced = start;
  gc::Prefetcher prefetcher(dev,
                            [&]() -> std::optional<gc::HostBatch> {
                              if (produced >= o.steps) return std::nullopt;
                              return make_batch(static_cast<std::uint64_t>(produced++), n, o.noise, dtype);
                            },
                            {3, gc::MemoryKind::device});
  double first_loss = -1, last_loss = 0;
  int since = 0, skipped_logged = 0;
  auto t0 = std::chrono::steady_clock::now();
  int skipped_recorded = 0;
  auto step_began = std::chrono::steady_clock::now();
  for (int step = start; step < o.steps; ++step) {
    auto batch = prefetcher.next(s);
    const double data_wait = prefetcher.last_wait().stream_idle_seconds;  // the stream's stall, not the host's wait
    if (!batch) break;
    const gc::BufferView x = batch->arrays()[0], y = batch->arrays()[1];
    forward(x);
    gc::mse_loss(scores, y, loss, dscores, s, &scaler);
    // Backward: the head, then each convolution's filter, bias and input gradients.
    gemm(dw3, h2, dscores, kFlat, kClasses, n, true, false);  // dW3 = h2^T dscores
    gc::bias_grad(dscores, n, kClasses, db3, s);
    gemm(dh2, dscores, w3, n, kFlat, kClasses, false, true);  // dh2 = dscores W3^T
    gc::relu_backward(dh2, h2, s);
    gc::bias_grad(dh2, n * kSide2 * kSide2, kC2, db2, s);  // NHWC: rows are pixels
    gc::conv2d_backward_filter(dw2, h1, dh2, conv2(n), s);
    if (step == o.overflow_at) gc::fill(dw2, INFINITY, s);  // forced: the scaler must skip this step
    gc::conv2d_backward_data(dh1, dh2, w2, conv2(n), s);
    gc::relu_backward(dh1, h1, s);
    gc::bias_grad(dh1, n * kSide * kSide, kC1, db1, s);
    gc::conv2d_backward_filter(dw1, x, dh1, conv1(n), s);
    scaler.unscale(grads, s);
    adam.step(s, &scaler);
    scaler.update(s);
    ++since;
    if (checkpointer && (step + 1) % o.checkpoint_every == 0) {
      checkpointer->save_async(step + 1, state, s, {{"example", "train_cnn"}});
      std::printf("checkpoint: step %d (writing in the background)\n", step + 1);
    }
    gc::telemetry::StepRecord record;
    record.samples = n;
    record.data_wait_seconds = data_wait;
    if (step == start || (step + 1) % o.log_every == 0 || step + 1 == o.steps || step == o.overflow_at) {
      const double value = read_floats(loss, s)[0];
      const gc::LossScalerState st = scaler.state(s);
      const int skipped = step + 1 - static_cast<int>(adam.step_count(s));
      if (first_loss < 0) first_loss = value;
      last_loss = value;
      const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      std::printf("step %5d  loss %.5f  scale %8.0f  samples/s %8.0f  skipped %d  %s\n", step + 1, value, st.scale,
                  since * n / (secs > 0 ? secs : 1e-9), skipped, examples::brief(monitor.latest()).c_str());
      if (skipped > skipped_logged) {
        std::printf("  overflow: %d step(s) skipped so far (the scale backed off to %.0f)\n", skipped, st.scale);
        skipped_logged = skipped;
      }
      t0 = std::chrono::steady_clock::now();
      since = 0;
      record.loss_scale = st.scale;  // read here, where the step synchronised anyway
      record.skipped = skipped - skipped_recorded;
      skipped_recorded = skipped;
    }
    if (metrics) {
      record.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - step_began).count();
      metrics->steps().record(record);
    }
    step_began = std::chrono::steady_clock::now();
  }
  if (checkpointer) checkpointer->wait();
  // Held-out accuracy, in batches of n.
  int correct = 0, seen = 0;
  gc::Buffer x_dev = buffer(un * kSide * kSide, dtype);
  for (int b = 0; seen < kHeldOut; ++b) {
    const gc::HostBatch hb = make_batch(kHeldOutStep + static_cast<std::uint64_t>(b), n, o.noise, dtype);
    gc::copy(x_dev, hb.arrays[0], s);
    forward(x_dev);
    const std::vector<float> sc = read_floats(scores, s);
    for (int i = 0; i < n && seen < kHeldOut; ++i, ++seen) {
      int best = 0;
      for (int c = 1; c < kClasses; ++c)
        best = sc[static_cast<std::size_t>(i * kClasses + c)] > sc[static_cast<std::size_t>(i * kClasses + best)]
                   ? c
                   : best;
      correct += best == hb.arrays[2].data_as<std::int32_t>()[i];
    }
  }
  const double accuracy = static_cast<double>(correct) / seen;
  std::printf(
      "final: loss %.5f (first %.5f), held-out accuracy %.4f on %d images (target %.2f: %s), skipped steps %d\n",
      last_loss, first_loss, accuracy, seen, o.target, accuracy >= o.target ? "reached" : "NOT reached",
      o.steps - static_cast<int>(adam.step_count(s)));
  std::printf("%s\n", examples::describe(monitor.summary(), static_cast<double>(adam.step_count(s)) * o.batch).c_str());
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "train_cnn: %s\n", e.what());
  return 1;
}
