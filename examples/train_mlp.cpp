// Data-parallel mixed-precision training of a multi-layer perceptron, with every piece of gpucloud
// in its real role: batches streamed by the Prefetcher, forward and backward through the GEMM
// with bias/ReLU epilogues, the MSE loss with a loss-scaled gradient, dynamic loss scaling with
// skipped steps logged, fp32 master weights and fused AdamW, gradients averaged across ranks by
// buckets (hierarchical when there is more than one node), an asynchronous checkpoint every N
// steps (gpucloud::checkpoint: written in the background by all ranks, committed atomically) that
// a restarted run resumes from with the same trajectory, on any number of ranks.
//
// The task: regression onto a fixed random teacher network y = w3 . tanh(W2 tanh(W1 x)); the data
// of step s, sample i is a pure function of (seed, s, i), so any number of ranks sees the same
// global batch and a resumed run the same data.
//
//   train_mlp [--steps N] [--batch B] [--dtype fp16|bf16|fp32] [--lr X] [--log-every K]
//             [--checkpoint-dir DIR] [--checkpoint-every N] [--keep-last K] [--resume] [--checkpoint-sync]
//             [--overflow-at STEP] [--device host|cuda] [--dump FILE] [--metrics-port P]
//   mpirun -np 2 train_mlp ...        data-parallel over MPI ranks (host backend)
#include <gpucloud/gpucloud.hpp>

#include "example_support.hpp"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace gc = gpucloud;
using examples::normal;
using examples::read_floats;
using examples::write_floats;

namespace {

constexpr int kIn = 32, kHidden = 128, kTeacherHidden = 16;

struct Options {
  int steps = 3000, batch = 256, log_every = 250, checkpoint_every = 1000, keep_last = 3;
  float lr = 3e-3f;
  std::string dtype = "fp16", device = "host", checkpoint_dir, dump;
  bool resume = false, checkpoint_sync = false;
  int overflow_at = 1500;  // a forced overflow: the step must be skipped and logged (-1: none)
  int metrics_port = -1;   // serve Prometheus metrics (0: a free port; P > 0: P + local rank)
  int slow_rank = -1;      // test hook: this rank sleeps --slow-ms per step (a straggler)
  int slow_ms = 0;
  double target = 0.01;  // the final loss must fall below 1 % of the first step's
};

Options parse(int argc, char** argv) {
  Options o;
  using examples::into;
  examples::parse_options(argc, argv, "train_mlp",
                          {{"--steps", into(o.steps)},
                           {"--batch", into(o.batch)},
                           {"--dtype", into(o.dtype)},
                           {"--lr", into(o.lr)},
                           {"--log-every", into(o.log_every)},
                           {"--checkpoint-dir", into(o.checkpoint_dir)},
                           {"--checkpoint-every", into(o.checkpoint_every)},
                           {"--keep-last", into(o.keep_last)},
                           {"--metrics-port", into(o.metrics_port)},
                           {"--slow-rank", into(o.slow_rank)},
                           {"--slow-ms", into(o.slow_ms)},
                           {"--overflow-at", into(o.overflow_at)},
                           {"--device", into(o.device)},
                           {"--dump", into(o.dump)},
                           {"--target", into(o.target)}},
                          {{"--resume", &o.resume}, {"--checkpoint-sync", &o.checkpoint_sync}});
  using examples::require;
  constexpr const char* p = "train_mlp";
  require(o.steps >= 1, p, "--steps", "must be at least 1");
  require(o.batch >= 1, p, "--batch", "must be at least 1");
  require(o.log_every >= 1, p, "--log-every", "must be at least 1");
  require(o.checkpoint_every >= 1, p, "--checkpoint-every", "must be at least 1");
  require(o.lr > 0.0f, p, "--lr", "must be positive");
  require(o.target > 0.0, p, "--target", "must be positive");
  require(o.overflow_at >= -1, p, "--overflow-at", "a step, or -1 for none");
  require(o.keep_last >= 0, p, "--keep-last", "a count, or 0 to keep every checkpoint");
  require(o.metrics_port >= -1 && o.metrics_port <= 65535, p, "--metrics-port",
          "a port, 0 for a free one, -1 for none");
  require(o.slow_ms >= 0, p, "--slow-ms", "must be at least 0");
  examples::require_one_of(o.dtype, {"fp16", "bf16", "fp32"}, p, "--dtype");
  require(!o.resume || !o.checkpoint_dir.empty(), p, "--resume", "needs --checkpoint-dir DIR");
  return o;
}

struct Teacher {
  std::vector<double> w1, w2, w3;
  Teacher() {
    for (int i = 0; i < kIn * kTeacherHidden; ++i)
      w1.push_back(normal(7, 1, 0, static_cast<std::uint64_t>(i)) / std::sqrt(kIn));
    for (int i = 0; i < kTeacherHidden * kTeacherHidden; ++i)
      w2.push_back(normal(7, 2, 0, static_cast<std::uint64_t>(i)) / std::sqrt(kTeacherHidden));
    for (int i = 0; i < kTeacherHidden; ++i) w3.push_back(normal(7, 3, 0, static_cast<std::uint64_t>(i)));
  }
  double operator()(const double* x) const {
    double h1[kTeacherHidden], y = 0;
    for (int j = 0; j < kTeacherHidden; ++j) {
      double s = 0;
      for (int i = 0; i < kIn; ++i) s += x[i] * w1[i * kTeacherHidden + j];
      h1[j] = std::tanh(s);
    }
    for (int j = 0; j < kTeacherHidden; ++j) {
      double s = 0;
      for (int i = 0; i < kTeacherHidden; ++i) s += h1[i] * w2[i * kTeacherHidden + j];
      y += std::tanh(s) * w3[j];
    }
    return y;
  }
};

// One rank's share of the global batch of @p step: inputs in the model dtype, targets in fp32.
gc::HostBatch make_batch(const Teacher& teacher, int step, int rank, int local, gc::DType dtype) {
  struct Owned {
    gc::Buffer x, y;
  };
  auto owned = std::make_shared<Owned>();
  owned->x = gc::Buffer(static_cast<std::size_t>(local * kIn), dtype, gc::Device::host(), gc::MemoryKind::pinned);
  owned->y =
      gc::Buffer(static_cast<std::size_t>(local), gc::DType::float32, gc::Device::host(), gc::MemoryKind::pinned);
  std::vector<float> xs(static_cast<std::size_t>(local * kIn));
  for (int r = 0; r < local; ++r) {
    const std::uint64_t sample =
        static_cast<std::uint64_t>(rank) * static_cast<std::uint64_t>(local) + static_cast<std::uint64_t>(r);
    double x[kIn];
    for (int i = 0; i < kIn; ++i) {
      x[i] = normal(11, static_cast<std::uint64_t>(step), sample, static_cast<std::uint64_t>(i));
      xs[static_cast<std::size_t>(r * kIn + i)] = static_cast<float>(x[i]);
    }
    owned->y.data_as<float>()[r] = static_cast<float>(teacher(x));
  }
  for (std::size_t i = 0; i < xs.size(); ++i) examples::store(owned->x, i, xs[i]);
  return gc::HostBatch{{owned->x.view(), owned->y.view()}, owned};
}

struct Layer {
  int in, out;
  gc::Buffer w, b, dw, db;
};

}  // namespace

int main(int argc, char** argv) try {
  const Options o = parse(argc, argv);
  const gc::DType dtype = o.dtype == "fp16"   ? gc::DType::float16
                          : o.dtype == "bf16" ? gc::DType::bfloat16
                                              : gc::DType::float32;
  const gc::LaunchInfo launch = gc::launch_info_from_environment();
  gc::Device dev = gc::Device::parse(o.device);
  // Several ranks on GPUs: "--device cuda" means one GPU per rank (the local rank's), and the
  // gradients travel over NCCL; on the host they travel over MPI.
  if (launch.size > 1 && o.device == "cuda") dev = gc::Device::cuda(launch.local_rank % gc::cuda_device_count());
  std::optional<gc::Communicator> comm;
  if (launch.size > 1) {
    comm.emplace(dev.is_cuda() ? gc::Communicator::nccl_from_mpi(dev) : gc::Communicator::mpi_world());
  }
  const int rank = comm ? comm->rank() : 0, size = comm ? comm->size() : 1;
  if (o.batch % size != 0)
    throw gc::InvalidArgument("train_mlp", "--batch must divide by the number of ranks", __FILE__, __LINE__);
  const int local = o.batch / size;
  auto say = [&](const char* fmt, auto... args) {
    if (rank == 0) std::printf(fmt, args...), std::fflush(stdout);
  };
  say("train_mlp: %d rank(s) on %s, %s, global batch %d, %d steps\n", size, dev.str().c_str(), gc::dtype_name(dtype),
      o.batch, o.steps);

  // Device allocations counted (for the memory-pool metrics): every buffer below comes through
  // this adaptor, which outlives them all; the default is restored when main returns.
  gc::StatisticsAdaptor memory_stats(gc::default_resource(gc::MemoryKind::device, dev));
  gc::set_default_resource(gc::MemoryKind::device, dev, &memory_stats);
  struct Restore {
    gc::Device dev;
    ~Restore() { gc::set_default_resource(gc::MemoryKind::device, dev, nullptr); }
  } restore{dev};
  gc::Stream s(dev);
  // Rank 0 watches its device's load (nvidia-smi's figures) for the progress lines and the summary.
  std::optional<gc::MetricsMonitor> monitor;
  if (rank == 0 || o.metrics_port >= 0) monitor.emplace(dev);
  // Prometheus metrics of this rank (docs/telemetry.md): its device and its steps. A port that
  // cannot be served is reported, and the training goes on without it.
  std::optional<gc::telemetry::Exporter> metrics;
  if (o.metrics_port >= 0) {
    try {
      gc::telemetry::ExporterOptions mo;
      mo.port = o.metrics_port > 0 ? o.metrics_port + launch.local_rank : 0;
      mo.labels = gc::telemetry::job_labels(launch);
      metrics.emplace(mo);
      metrics->watch(*monitor);
      std::printf("rank %d: metrics at http://%s:%d/metrics\n", launch.rank, mo.labels["node"].c_str(),
                  metrics->port());
    } catch (const gc::Error& e) {
      std::printf("rank %d: metrics not served (%s); training goes on\n", launch.rank, e.what());
    }
    std::fflush(stdout);
  }
  // Model: 32 -> 128 -> 128 -> 1, ReLU; He-initialised (the same on every rank).
  std::vector<Layer> layers;
  const int dims[4] = {kIn, kHidden, kHidden, 1};
  for (int l = 0; l < 3; ++l) {
    Layer L{dims[l], dims[l + 1], {}, {}, {}, {}};
    std::vector<float> w(static_cast<std::size_t>(L.in * L.out)), b(static_cast<std::size_t>(L.out), 0.0f);
    for (std::size_t i = 0; i < w.size(); ++i)
      w[i] = static_cast<float>(normal(3, static_cast<std::uint64_t>(l), 0, i) * std::sqrt(2.0 / L.in));
    L.w = gc::Buffer(w.size(), dtype, dev);
    L.b = gc::Buffer(b.size(), dtype, dev);
    L.dw = gc::Buffer(w.size(), dtype, dev);
    L.db = gc::Buffer(b.size(), dtype, dev);
    write_floats(L.w, w, s);
    write_floats(L.b, b, s);
    layers.push_back(std::move(L));
  }
  // Parameters in backward order (the bucket order): W3, b3, W2, b2, W1, b1.
  std::vector<gc::ParamGrad> params;
  std::vector<gc::BufferView> grads;
  for (int l = 2; l >= 0; --l) {
    params.push_back({layers[l].w, layers[l].dw});
    params.push_back({layers[l].b, layers[l].db});
    grads.push_back(layers[l].dw);
    grads.push_back(layers[l].db);
  }
  gc::AdamOptions adam_options = gc::AdamOptions::adamw();
  adam_options.lr = o.lr;
  adam_options.weight_decay = 0.0f;
  gc::FusedAdam adam(params, adam_options, s);
  gc::LossScalerOptions scaler_options;
  scaler_options.dynamic = dtype == gc::DType::float16;  // bf16 and fp32 need no loss scale
  if (!scaler_options.dynamic) scaler_options.init_scale = 1.0f;
  gc::LossScaler scaler(dev, s, scaler_options);
  std::unique_ptr<gc::GradBucketer> buckets;
  if (comm) {
    gc::BucketOptions bo;
    bo.hierarchical = comm->nodes() > 1 && comm->local_size() > 1;
    buckets = std::make_unique<gc::GradBucketer>(*comm, grads, bo);
    say("buckets: %zu, hierarchical all-reduce: %s (%d node(s) of %d)\n", buckets->bucket_count(),
        bo.hierarchical ? "yes" : "no", comm->nodes(), comm->local_size());
  }

  // What a checkpoint holds: the weights, the optimizer's state (fp32 masters, moments, step
  // count) and the scaler's, all views of the live state (saving and loading copy in stream order).
  // The data needs no position: the batch of a step is a function of the step.
  gc::StateDict state;
  for (int l = 0; l < 3; ++l) {
    const std::string name = "model.layer" + std::to_string(l);
    state[name + ".weight"] = {layers[l].w, {layers[l].in, layers[l].out}};
    state[name + ".bias"] = {layers[l].b, {}};
  }
  gc::merge_state(state, "optimizer.", adam.state_dict());
  gc::merge_state(state, "scaler.", scaler.state_dict());
  std::optional<gc::checkpoint::Checkpointer> checkpointer;
  gc::checkpoint::PendingSave pending_save;
  if (!o.checkpoint_dir.empty()) {
    gc::checkpoint::Options co;
    co.keep_last = o.keep_last;
    co.comm = comm ? &*comm : nullptr;
    checkpointer.emplace(o.checkpoint_dir, co);
  }
  int start = 0;
  if (o.resume) {
    if (const auto dir = gc::checkpoint::latest(o.checkpoint_dir)) {
      const auto manifest = gc::checkpoint::load(*dir, state, s);
      adam.load_state_dict(gc::sub_state(state, "optimizer."), s);
      scaler.load_state_dict(gc::sub_state(state, "scaler."), s);
      start = static_cast<int>(manifest.step);
      say("resumed from %s at step %d (written by %d rank(s))\n", dir->c_str(), start, manifest.world_size);
    } else {
      say("no checkpoint in %s yet: starting from step 0\n", o.checkpoint_dir.c_str());
    }
  }

  const Teacher teacher;
  int produced = start;
  gc::Prefetcher prefetcher(dev,
                            [&]() -> std::optional<gc::HostBatch> {
                              if (produced >= o.steps) return std::nullopt;
                              return make_batch(teacher, produced++, rank, local, dtype);
                            },
                            {3, gc::MemoryKind::device});

  // Activations and their gradients.
  auto act = [&](int n) { return gc::Buffer(static_cast<std::size_t>(local * n), dtype, dev); };
  gc::Buffer h1 = act(kHidden), h2 = act(kHidden), dh1 = act(kHidden), dh2 = act(kHidden), dout = act(1);
  gc::Buffer pred(static_cast<std::size_t>(local), gc::DType::float32, dev), loss(1, gc::DType::float32, dev);
  gc::Buffer loss_sum(1, gc::DType::float32, dev);  // averaged over ranks for logging
  gc::Buffer b3f(1, gc::DType::float32, dev);

  auto gemm = [&](gc::BufferView c, gc::BufferView a, gc::BufferView b, int m, int n, int k, bool ta, bool tb,
                  gc::Epilogue e = gc::Epilogue::none, gc::BufferView bias = {}) {
    gc::GemmArgs g;
    g.m = m;
    g.n = n;
    g.k = k;
    g.trans_a = ta ? gc::Transpose::transpose : gc::Transpose::none;
    g.trans_b = tb ? gc::Transpose::transpose : gc::Transpose::none;
    g.epilogue = e;
    g.bias = bias;
    gc::gemm(c, a, b, g, s);
  };

  if (metrics && comm) metrics->detect_stragglers(*comm, s, {50, 0.2});
  double first_loss = -1, last_loss = 0;
  int skipped = 0, skipped_logged = 0, skipped_recorded = 0, straggler_logged = -1;
  double scaler_scale = 0;
  auto step_began = std::chrono::steady_clock::now();
  double comm_before = comm ? comm->busy_seconds() : 0.0;
  auto t0 = std::chrono::steady_clock::now();
  int since_log = 0;
  // Where the run's time went: waiting for data (the prefetcher), the collectives' own time
  // (the communicator's busy_seconds, from its stream work, not wall clocks around calls), and
  // the rest (compute, and the host enqueueing it).
  const auto run_began = std::chrono::steady_clock::now();
  const double comm_at_start = comm ? comm->busy_seconds() : 0.0;
  double data_wait_total = 0;
  int steps_run = 0;
  for (int step = start; step < o.steps; ++step) {
    const auto wait_began = std::chrono::steady_clock::now();
    auto batch = prefetcher.next(s);
    const double data_wait = std::chrono::duration<double>(std::chrono::steady_clock::now() - wait_began).count();
    if (!batch) break;
    data_wait_total += data_wait;
    ++steps_run;
    if (rank == o.slow_rank) std::this_thread::sleep_for(std::chrono::milliseconds(o.slow_ms));
    const gc::BufferView x = batch->arrays()[0], y = batch->arrays()[1];
    // Forward.
    gemm(h1, x, layers[0].w, local, kHidden, kIn, false, false, gc::Epilogue::bias_relu, layers[0].b);
    gemm(h2, h1, layers[1].w, local, kHidden, kHidden, false, false, gc::Epilogue::bias_relu, layers[1].b);
    gc::GemmArgs head;
    head.m = local;
    head.n = 1;
    head.k = kHidden;
    head.epilogue = gc::Epilogue::bias;
    gc::cast(b3f, layers[2].b, s);  // the output is fp32: its bias is given in fp32
    head.bias = b3f;
    gc::gemm(pred, h2, layers[2].w, head, s);
    // Loss and the scaled gradient of the output, in the model dtype.
    gc::mse_loss(pred, y, loss, dout, s, &scaler);
    // Backward, marking each gradient ready for its bucket as soon as it exists.
    auto ready = [&](std::size_t i) {
      if (buckets) buckets->mark_ready(i, s);
    };
    gemm(layers[2].dw, h2, dout, kHidden, 1, local, true, false);
    ready(0);
    gc::bias_grad(dout, local, 1, layers[2].db, s);
    ready(1);
    gemm(dh2, dout, layers[2].w, local, kHidden, 1, false, true);
    gc::relu_backward(dh2, h2, s);
    gemm(layers[1].dw, h1, dh2, kHidden, kHidden, local, true, false);
    if (step == o.overflow_at) gc::fill(layers[1].dw, std::numeric_limits<double>::infinity(), s);  // forced overflow
    ready(2);
    gc::bias_grad(dh2, local, kHidden, layers[1].db, s);
    ready(3);
    gemm(dh1, dh2, layers[1].w, local, kHidden, kHidden, false, true);
    gc::relu_backward(dh1, h1, s);
    gemm(layers[0].dw, x, dh1, kIn, kHidden, local, true, false);
    ready(4);
    gc::bias_grad(dh1, local, kHidden, layers[0].db, s);
    ready(5);
    if (buckets) buckets->wait(s);
    // Unscale, skip on overflow (decided on the device), update the scale.
    scaler.unscale(grads, s);
    adam.step(s, &scaler);
    scaler.update(s);
    batch.reset();  // its memory returns to the pool in s's order
    ++since_log;
    const bool log = step == start || (step + 1) % o.log_every == 0 || step + 1 == o.steps || step == o.overflow_at;
    if (log) {
      if (comm)
        comm->all_reduce(loss, loss_sum, gc::ReduceOp::average, s);
      else
        gc::copy(loss_sum, loss, s);
      const auto st = scaler.state(s);  // synchronises: only at log steps
      scaler_scale = st.scale;
      const double l = read_floats(loss_sum, s)[0];
      const std::size_t done = adam.step_count(s);
      skipped = (step + 1) - static_cast<int>(done);
      if (first_loss < 0) first_loss = l;
      last_loss = l;
      const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      say("step %5d  loss %.5f  scale %8.0f  samples/s %8.0f  skipped %d  %s\n", step + 1, l, st.scale,
          since_log * o.batch / std::max(secs, 1e-9), skipped,
          monitor ? examples::brief(monitor->latest()).c_str() : "");
      if (skipped > skipped_logged) {
        say("  overflow: %d step(s) skipped so far (the scale backed off to %.0f)\n", skipped, st.scale);
        skipped_logged = skipped;
      }
      t0 = std::chrono::steady_clock::now();
      since_log = 0;
      if (metrics) metrics->steps().record_memory(memory_stats.statistics());
    }
    if (metrics) {
      // One record per step: its wall time, its wait for data, its collectives' own time; the
      // scale and the skips where a log step read them.
      const auto now = std::chrono::steady_clock::now();
      gc::telemetry::StepRecord r;
      r.seconds = std::chrono::duration<double>(now - step_began).count();
      r.samples = local;
      r.data_wait_seconds = data_wait;
      const double comm_now = comm ? comm->busy_seconds() : 0.0;
      r.comm_seconds = comm_now - comm_before;
      comm_before = comm_now;
      if (log) {
        r.loss_scale = scaler_scale;
        r.skipped = skipped - skipped_recorded;
        skipped_recorded = skipped;
      }
      metrics->steps().record(r);
      const auto report = metrics->straggler_report();
      if (report.straggler && report.slowest != straggler_logged) {
        say("  straggler: rank %d takes %.1f ms per step, %.0f %% above the median %.1f ms\n", report.slowest,
            1e3 * report.step_seconds[static_cast<std::size_t>(report.slowest)],
            100.0 * (report.step_seconds[static_cast<std::size_t>(report.slowest)] / report.median - 1.0),
            1e3 * report.median);
        straggler_logged = report.slowest;
      }
    }
    step_began = std::chrono::steady_clock::now();
    if (checkpointer && (step + 1) % o.checkpoint_every == 0) {
      // Snapshotted after this step's work, written while the next steps run; the save before
      // it has finished by now (or its error is raised here).
      const gc::checkpoint::Metadata meta{{"example", "train_mlp"}, {"dtype", o.dtype}};
      if (o.checkpoint_sync) {  // for contrast (bench/bench_checkpoint_train.py): the loop waits
        const auto began = std::chrono::steady_clock::now();
        checkpointer->save(step + 1, state, s, meta);
        if (metrics) {
          metrics->steps().record_checkpoint(
              std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count());
        }
        say("checkpoint: step %d written\n", step + 1);
      } else {
        // The previous save is done by now (save_async waited for it): its time from start to commit.
        if (metrics && pending_save.done() && pending_save.seconds() > 0) {
          metrics->steps().record_checkpoint(pending_save.seconds());
        }
        pending_save = checkpointer->save_async(step + 1, state, s, meta);
        say("checkpoint: step %d -> %s (writing in the background)\n", step + 1, pending_save.directory().c_str());
      }
    }
  }
  if (checkpointer) checkpointer->wait();
  s.synchronize();
  const double run_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - run_began).count();
  const double comm_seconds = comm ? comm->busy_seconds() - comm_at_start : 0.0;
  if (steps_run > 0 && run_seconds > 0) {
    const auto pct = [&](double v) { return 100.0 * v / run_seconds; };
    const double rest = std::max(0.0, run_seconds - data_wait_total - comm_seconds);
    say("time: %.2f s for %d steps, %.0f samples/s (%d rank%s); data wait %.2f s (%.1f %%), communication %.2f s "
        "(%.1f %%), compute and the rest %.2f s (%.1f %%)\n",
        run_seconds, steps_run, static_cast<double>(steps_run) * o.batch / run_seconds, size, size == 1 ? "" : "s",
        data_wait_total, pct(data_wait_total), comm_seconds, pct(comm_seconds), rest, pct(rest));
  }
  if (!o.dump.empty() && rank == 0) {
    std::ofstream f(o.dump, std::ios::binary);
    for (std::size_t p = 0; p < params.size(); ++p) {
      const gc::BufferView master = adam.master(p);
      const auto w = read_floats(master.empty() ? params[p].param : master, s);
      f.write(reinterpret_cast<const char*>(w.data()), static_cast<std::streamsize>(w.size() * 4));
    }
  }
  if (start >= o.steps) {
    say("final: nothing to do, the checkpoint is already at step %d (steps done %zu)\n", start, adam.step_count(s));
    return 0;
  }
  const double ratio = first_loss > 0 ? last_loss / first_loss : 1.0;
  say("final: loss %.5f (first logged %.5f, ratio %.4f, target < %.2f: %s), skipped steps %d, steps done %zu\n",
      last_loss, first_loss, ratio, o.target, ratio < o.target ? "reached" : "NOT reached", skipped,
      adam.step_count(s));
  if (monitor) say("%s\n", examples::describe(monitor->summary()).c_str());
  return 0;  // the target is reported, not enforced: short test runs stop before it
} catch (const std::exception& e) {
  std::fprintf(stderr, "train_mlp: %s\n", e.what());
  return 1;
}
