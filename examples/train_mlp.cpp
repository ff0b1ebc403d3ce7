// Data-parallel mixed-precision training of a multi-layer perceptron, with every piece of gpucloud
// in its real role: batches streamed by the Prefetcher, forward and backward through the GEMM
// with bias/ReLU epilogues, the MSE loss with a loss-scaled gradient, dynamic loss scaling with
// skipped steps logged, fp32 master weights and fused AdamW, gradients averaged across ranks by
// buckets (hierarchical when there is more than one node), an asynchronous checkpoint every N
// steps (gpucloud::checkpoint: written in the background by all ranks, committed atomically) that
// a restarted run resumes from with the same trajectory, on any number of ranks.
//
// On SIGTERM or SIGUSR1 (a preemption notice, Slurm's --signal, gpucloud-run passing one on) every
// rank finishes its step, agrees on where to stop (gpucloud::elastic::JobControl), writes a
// checkpoint at that step and exits with status 75: the resumed run loses no step.
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

// The teacher network the model learns: 32 -> 16 -> 16 -> 1, tanh, fixed random weights, in
// float with the hidden units innermost (vectorised). Together with the inputs' normals this is
// the data loader's work per sample, which the prefetcher hides behind the training step.
struct Teacher {
  std::vector<float> w1, w2, w3;
  Teacher() {
    for (int i = 0; i < kIn * kTeacherHidden; ++i)
      w1.push_back(static_cast<float>(normal(7, 1, 0, static_cast<std::uint64_t>(i)) / std::sqrt(kIn)));
    for (int i = 0; i < kTeacherHidden * kTeacherHidden; ++i)
      w2.push_back(static_cast<float>(normal(7, 2, 0, static_cast<std::uint64_t>(i)) / std::sqrt(kTeacherHidden)));
    for (int i = 0; i < kTeacherHidden; ++i)
      w3.push_back(static_cast<float>(normal(7, 3, 0, static_cast<std::uint64_t>(i))));
  }
  float operator()(const float* x) const {
    float h1[kTeacherHidden] = {}, h2[kTeacherHidden] = {};
    for (int i = 0; i < kIn; ++i) {
      for (int j = 0; j < kTeacherHidden; ++j) h1[j] += x[i] * w1[static_cast<std::size_t>(i * kTeacherHidden + j)];
    }
    for (int j = 0; j < kTeacherHidden; ++j) h1[j] = std::tanh(h1[j]);
    for (int i = 0; i < kTeacherHidden; ++i) {
      for (int j = 0; j < kTeacherHidden; ++j) h2[j] += h1[i] * w2[static_cast<std::size_t>(i * kTeacherHidden + j)];
    }
    float y = 0.0f;
    for (int j = 0; j < kTeacherHidden; ++j) y += std::tanh(h2[j]) * w3[static_cast<std::size_t>(j)];
    return y;
  }
};

// One rank's share of the global batch of @p step: inputs in the model dtype, targets in fp32.
// Sample s of a step is the same whichever rank draws it (the 1- and 2-rank runs agree).
// @p loader is the loader thread's own host stream: the conversion into the model dtype is one
// vectorised gc::cast, run on the calling thread (a small cast on an idle host stream is).
gc::HostBatch make_batch(const Teacher& teacher, int step, int rank, int local, gc::DType dtype,
                         gc::StreamView loader) {
  struct Owned {
    gc::Buffer x, y;
  };
  auto owned = std::make_shared<Owned>();
  owned->x = gc::Buffer(static_cast<std::size_t>(local * kIn), dtype, gc::Device::host(), gc::MemoryKind::pinned);
  owned->y =
      gc::Buffer(static_cast<std::size_t>(local), gc::DType::float32, gc::Device::host(), gc::MemoryKind::pinned);
  gc::Buffer drawn(static_cast<std::size_t>(local * kIn), gc::DType::float32, gc::Device::host());
  float* xs = drawn.data_as<float>();
  for (int r = 0; r < local; ++r) {
    const std::uint64_t sample =
        static_cast<std::uint64_t>(rank) * static_cast<std::uint64_t>(local) + static_cast<std::uint64_t>(r);
    float* x = xs + static_cast<std::size_t>(r * kIn);
    for (int i = 0; i < kIn; i += 2) {
      examples::normal_pair(11, static_cast<std::uint64_t>(step), sample, static_cast<std::uint64_t>(i), x[i],
                            x[i + 1]);
    }
    owned->y.data_as<float>()[r] = teacher(x);
  }
  gc::cast(owned->x, drawn, loader);
  loader.synchronize();
  return gc::HostBatch{{owned->x.view(), owned->y.view()}, owned};
}

struct Layer {
  int in, out;
  gc::Buffer w, b, dw, db;
};

// Rank 0 prints (printf's format), at once.
template <class... Args>
void say(int rank, const char* format, Args... args) {
  if (rank != 0) return;
  std::printf(format, args...);
  std::fflush(stdout);
}

// Where this rank runs, and its peers: one GPU per rank with "--device cuda" on several ranks
// (the gradients then travel over NCCL), the host and MPI otherwise.
struct Job {
  gc::LaunchInfo launch;
  gc::Device dev;
  std::optional<gc::Communicator> comm;
  int rank = 0, size = 1;
  int local = 0;  // this rank's share of the global batch
};

Job start_job(const Options& o) {
  Job job{gc::launch_info_from_environment(), gc::Device::parse(o.device), std::nullopt};
  if (job.launch.size > 1 && o.device == "cuda")
    job.dev = gc::Device::cuda(job.launch.local_rank % gc::cuda_device_count());
  if (job.launch.size > 1) {
    job.comm.emplace(job.dev.is_cuda() ? gc::Communicator::nccl_from_mpi(job.dev) : gc::Communicator::mpi_world());
  }
  job.rank = job.comm ? job.comm->rank() : 0;
  job.size = job.comm ? job.comm->size() : 1;
  if (o.batch % job.size != 0)
    throw gc::InvalidArgument("train_mlp", "--batch must divide by the number of ranks", __FILE__, __LINE__);
  job.local = o.batch / job.size;
  return job;
}

// Prometheus metrics of this rank (docs/telemetry.md): its device and its steps. A port that
// cannot be served is reported, and the training goes on without it.
std::optional<gc::telemetry::Exporter> serve_metrics(const Options& o, const Job& job, gc::MetricsMonitor& monitor) {
  std::optional<gc::telemetry::Exporter> metrics;
  try {
    gc::telemetry::ExporterOptions mo;
    mo.port = o.metrics_port > 0 ? o.metrics_port + job.launch.local_rank : 0;
    mo.labels = gc::telemetry::job_labels(job.launch);
    metrics.emplace(mo);
    metrics->watch(monitor);
    std::printf("rank %d: metrics at http://%s:%d/metrics\n", job.launch.rank, mo.labels["node"].c_str(),
                metrics->port());
  } catch (const gc::Error& e) {
    std::printf("rank %d: metrics not served (%s); training goes on\n", job.launch.rank, e.what());
  }
  std::fflush(stdout);
  return metrics;
}

// The model: 32 -> 128 -> 128 -> 1, ReLU; He-initialised (the same on every rank), and its
// parameters in backward order (the bucket order): W3, b3, W2, b2, W1, b1.
struct Model {
  std::vector<Layer> layers;
  std::vector<gc::ParamGrad> params;
  std::vector<gc::BufferView> grads;
};

Model make_model(gc::DType dtype, gc::Device dev, gc::Stream& s) {
  Model m;
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
    m.layers.push_back(std::move(L));
  }
  for (int l = 2; l >= 0; --l) {
    m.params.push_back({m.layers[l].w, m.layers[l].dw});
    m.params.push_back({m.layers[l].b, m.layers[l].db});
    m.grads.push_back(m.layers[l].dw);
    m.grads.push_back(m.layers[l].db);
  }
  return m;
}

// What a checkpoint holds: the weights, the optimizer's state (fp32 masters, moments, step count)
// and the scaler's, all views of the live state (saving and loading copy in stream order). The
// data needs no position: the batch of a step is a function of the step.
gc::StateDict checkpoint_state(const Model& m, gc::FusedAdam& adam, gc::LossScaler& scaler) {
  gc::StateDict state;
  for (int l = 0; l < 3; ++l) {
    const std::string name = "model.layer" + std::to_string(l);
    state[name + ".weight"] = {m.layers[l].w, {m.layers[l].in, m.layers[l].out}};
    state[name + ".bias"] = {m.layers[l].b, {}};
  }
  gc::merge_state(state, "optimizer.", adam.state_dict());
  gc::merge_state(state, "scaler.", scaler.state_dict());
  return state;
}

// Loads the newest valid checkpoint of --checkpoint-dir into @p state and the optimizer and
// scaler; the step to continue from (0 when there is none yet).
int resume(const Options& o, const Job& job, gc::StateDict& state, gc::FusedAdam& adam, gc::LossScaler& scaler,
           gc::Stream& s) {
  const auto dir = gc::checkpoint::latest(o.checkpoint_dir);
  if (!dir) {
    say(job.rank, "no checkpoint in %s yet: starting from step 0\n", o.checkpoint_dir.c_str());
    return 0;
  }
  const auto began = std::chrono::steady_clock::now();
  const auto manifest = gc::checkpoint::load(*dir, state, s);
  adam.load_state_dict(gc::sub_state(state, "optimizer."), s);
  scaler.load_state_dict(gc::sub_state(state, "scaler."), s);
  s.synchronize();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count();
  const int start = static_cast<int>(manifest.step);
  say(job.rank, "resumed from %s at step %d (written by %d rank(s)) in %.3f s\n", dir->c_str(), start,
      manifest.world_size, seconds);
  return start;
}

// The activations of one step and their gradients, this rank's share of the batch.
struct Activations {
  gc::Buffer h1, h2, dh1, dh2, dout;
  gc::Buffer pred, loss;
  gc::Buffer b3f;  // the head's bias in fp32 (the output is fp32)
  Activations(int local, gc::DType dtype, gc::Device dev)
      : h1(size(local, kHidden), dtype, dev),
        h2(size(local, kHidden), dtype, dev),
        dh1(size(local, kHidden), dtype, dev),
        dh2(size(local, kHidden), dtype, dev),
        dout(size(local, 1), dtype, dev),
        pred(size(local, 1), gc::DType::float32, dev),
        loss(1, gc::DType::float32, dev),
        b3f(1, gc::DType::float32, dev) {}
  static std::size_t size(int rows, int cols) { return static_cast<std::size_t>(rows * cols); }
};

// C = op(A) op(B) (m x n, inner dimension k) with an epilogue.
void gemm(gc::BufferView c, gc::BufferView a, gc::BufferView b, int m, int n, int k, bool ta, bool tb, gc::Stream& s,
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
}

// One step's forward and backward on (x, y): the loss into a.loss, the loss-scaled gradients
// into the model's, each handed to its bucket as soon as it exists (@p buckets: several ranks).
// @p overflow forces an inf into one gradient: the step must be skipped and logged.
void forward_backward(Model& m, Activations& a, gc::BufferView x, gc::BufferView y, int local, gc::LossScaler& scaler,
                      gc::GradBucketer* buckets, bool overflow, gc::Stream& s) {
  std::vector<Layer>& L = m.layers;
  // Forward.
  gemm(a.h1, x, L[0].w, local, kHidden, kIn, false, false, s, gc::Epilogue::bias_relu, L[0].b);
  gemm(a.h2, a.h1, L[1].w, local, kHidden, kHidden, false, false, s, gc::Epilogue::bias_relu, L[1].b);
  gc::cast(a.b3f, L[2].b, s);  // the output is fp32: its bias is given in fp32
  gemm(a.pred, a.h2, L[2].w, local, 1, kHidden, false, false, s, gc::Epilogue::bias, a.b3f);
  // Loss and the scaled gradient of the output, in the model dtype.
  gc::mse_loss(a.pred, y, a.loss, a.dout, s, &scaler);
  // Backward, marking each gradient ready for its bucket as soon as it exists.
  auto ready = [&](std::size_t i) {
    if (buckets) buckets->mark_ready(i, s);
  };
  gemm(L[2].dw, a.h2, a.dout, kHidden, 1, local, true, false, s);
  ready(0);
  gc::bias_grad(a.dout, local, 1, L[2].db, s);
  ready(1);
  gemm(a.dh2, a.dout, L[2].w, local, kHidden, 1, false, true, s);
  gc::relu_backward(a.dh2, a.h2, s);
  gemm(L[1].dw, a.h1, a.dh2, kHidden, kHidden, local, true, false, s);
  if (overflow) gc::fill(L[1].dw, std::numeric_limits<double>::infinity(), s);
  ready(2);
  gc::bias_grad(a.dh2, local, kHidden, L[1].db, s);
  ready(3);
  gemm(a.dh1, a.dh2, L[1].w, local, kHidden, kHidden, false, true, s);
  gc::relu_backward(a.dh1, a.h1, s);
  gemm(L[0].dw, x, a.dh1, kIn, kHidden, local, true, false, s);
  ready(4);
  gc::bias_grad(a.dh1, local, kHidden, L[0].db, s);
  ready(5);
}

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// The run's progress: the loss, scale and skips at log steps, a metrics record per step, and where
// the run's time went: waiting for data (the prefetcher), the collectives' own time (the
// communicator's busy_seconds, from its stream work, not wall clocks around calls), and the rest
// (compute, and the host enqueueing it).
class Progress {
 public:
  Progress(const Options& o, Job& job) : o_(o), job_(job), comm_at_start_(busy()), comm_before_(busy()) {}

  // The next batch from @p prefetcher (none after the last step), its wait counted: the time
  // the stream sat idle for it (the host thread, which runs ahead of the stream, may block in
  // next() longer while the stream still computes earlier steps).
  std::optional<gc::Batch> next_batch(gc::Prefetcher& prefetcher, gc::Stream& s) {
    auto batch = prefetcher.next(s);
    data_wait_ = prefetcher.last_wait().stream_idle_seconds;
    if (batch) {
      data_wait_total_ += data_wait_;
      ++steps_run_;
    }
    return batch;
  }

  // After step @p step: at log steps the loss averaged over ranks, the scale and the skipped
  // steps (these synchronise); then the step's metrics record.
  void after_step(int step, int start, gc::Buffer& loss, gc::LossScaler& scaler, gc::FusedAdam& adam,
                  gc::MetricsMonitor* monitor, gc::telemetry::Exporter* metrics,
                  const gc::StatisticsAdaptor& memory_stats, gc::Stream& s) {
    ++since_log_;
    const bool log = step == start || (step + 1) % o_.log_every == 0 || step + 1 == o_.steps || step == o_.overflow_at;
    if (log) {
      if (job_.comm)
        job_.comm->all_reduce(loss, loss_sum_, gc::ReduceOp::average, s);
      else
        gc::copy(loss_sum_, loss, s);
      const auto st = scaler.state(s);  // synchronises: only at log steps
      scaler_scale_ = st.scale;
      const double l = read_floats(loss_sum_, s)[0];
      const std::size_t done = adam.step_count(s);
      skipped_ = (step + 1) - static_cast<int>(done);
      if (first_loss_ < 0) first_loss_ = l;
      last_loss_ = l;
      const double secs = seconds_since(t0_);
      say(job_.rank, "step %5d  loss %.5f  scale %8.0f  samples/s %8.0f  skipped %d  %s\n", step + 1, l, st.scale,
          since_log_ * o_.batch / std::max(secs, 1e-9), skipped_,
          monitor ? examples::brief(monitor->latest()).c_str() : "");
      if (skipped_ > skipped_logged_) {
        say(job_.rank, "  overflow: %d step(s) skipped so far (the scale backed off to %.0f)\n", skipped_, st.scale);
        skipped_logged_ = skipped_;
      }
      t0_ = Clock::now();
      since_log_ = 0;
      if (metrics) metrics->steps().record_memory(memory_stats.statistics());
    }
    if (metrics) record(*metrics, log);
    step_began_ = Clock::now();
  }

  // The time line and the final loss against the target.
  void report(int start, gc::FusedAdam& adam, gc::MetricsMonitor* monitor, gc::Stream& s) const {
    const double run_seconds = seconds_since(run_began_);
    const double comm_seconds = busy() - comm_at_start_;
    if (steps_run_ > 0 && run_seconds > 0) {
      const auto pct = [&](double v) { return 100.0 * v / run_seconds; };
      const double rest = std::max(0.0, run_seconds - data_wait_total_ - comm_seconds);
      say(job_.rank,
          "time: %.2f s for %d steps, %.0f samples/s (%d rank%s); data wait %.2f s (%.1f %%), communication %.2f s "
          "(%.1f %%), compute and the rest %.2f s (%.1f %%)\n",
          run_seconds, steps_run_, static_cast<double>(steps_run_) * o_.batch / run_seconds, job_.size,
          job_.size == 1 ? "" : "s", data_wait_total_, pct(data_wait_total_), comm_seconds, pct(comm_seconds), rest,
          pct(rest));
    }
    if (start >= o_.steps) {
      say(job_.rank, "final: nothing to do, the checkpoint is already at step %d (steps done %zu)\n", start,
          adam.step_count(s));
      return;
    }
    const double ratio = first_loss_ > 0 ? last_loss_ / first_loss_ : 1.0;
    say(job_.rank,
        "final: loss %.5f (first logged %.5f, ratio %.4f, target < %.2f: %s), skipped steps %d, steps done %zu\n",
        last_loss_, first_loss_, ratio, o_.target, ratio < o_.target ? "reached" : "NOT reached", skipped_,
        adam.step_count(s));
    if (monitor) {
      const double samples = static_cast<double>(steps_run_) * o_.batch / job_.size;  // this rank's
      say(job_.rank, "%s\n", examples::describe(monitor->summary(), samples).c_str());
    }
  }

 private:
  double busy() const { return job_.comm ? job_.comm->busy_seconds() : 0.0; }

  // One record per step: its wall time, its wait for data, its collectives' own time; the scale
  // and the skips where a log step read them. Then a straggler, when one appears.
  void record(gc::telemetry::Exporter& metrics, bool log) {
    gc::telemetry::StepRecord r;
    r.seconds = seconds_since(step_began_);
    r.samples = job_.local;
    r.data_wait_seconds = data_wait_;
    const double comm_now = busy();
    r.comm_seconds = comm_now - comm_before_;
    comm_before_ = comm_now;
    if (log) {
      r.loss_scale = scaler_scale_;
      r.skipped = skipped_ - skipped_recorded_;
      skipped_recorded_ = skipped_;
    }
    metrics.steps().record(r);
    const auto report = metrics.straggler_report();
    if (report.straggler && report.slowest != straggler_logged_) {
      const double slowest = report.compute_seconds[static_cast<std::size_t>(report.slowest)];
      say(job_.rank, "  straggler: rank %d works %.1f ms per step, %.0f %% above the median %.1f ms\n", report.slowest,
          1e3 * slowest, 100.0 * (slowest / report.median - 1.0), 1e3 * report.median);
      straggler_logged_ = report.slowest;
    }
  }

  const Options& o_;
  Job& job_;
  gc::Buffer loss_sum_{1, gc::DType::float32, job_.dev};  // the loss averaged over ranks
  double first_loss_ = -1, last_loss_ = 0, scaler_scale_ = 0;
  int skipped_ = 0, skipped_logged_ = 0, skipped_recorded_ = 0, straggler_logged_ = -1;
  int since_log_ = 0, steps_run_ = 0;
  double data_wait_ = 0, data_wait_total_ = 0;
  Clock::time_point run_began_ = Clock::now(), step_began_ = Clock::now(), t0_ = Clock::now();
  double comm_at_start_, comm_before_;
};

// Every --checkpoint-every steps: snapshotted after this step's work, written while the next
// steps run (the save before it has finished by now, or its error is raised here); with
// --checkpoint-sync (for contrast, bench/bench_checkpoint_train.py) the loop waits for it.
void save_checkpoint(const Options& o, const Job& job, int step, gc::checkpoint::Checkpointer& checkpointer,
                     const gc::StateDict& state, gc::checkpoint::PendingSave& pending, gc::telemetry::Exporter* metrics,
                     gc::Stream& s) {
  const gc::checkpoint::Metadata meta{{"example", "train_mlp"}, {"dtype", o.dtype}};
  if (o.checkpoint_sync) {
    const auto began = Clock::now();
    checkpointer.save(step, state, s, meta);
    if (metrics) metrics->steps().record_checkpoint(seconds_since(began));
    say(job.rank, "checkpoint: step %d written\n", step);
    return;
  }
  // The previous save is done by now (save_async waited for it): its time from start to commit.
  if (metrics && pending.done() && pending.seconds() > 0) metrics->steps().record_checkpoint(pending.seconds());
  pending = checkpointer.save_async(step, state, s, meta);
  say(job.rank, "checkpoint: step %d -> %s (writing in the background)\n", step, pending.directory().c_str());
}

// Stops for a preemption after @p step steps (every rank at the same step): that step's
// checkpoint, committed before the exit, then the status that asks for a requeue.
int preempted(const Options& o, const Job& job, const gc::elastic::JobControl& control, int step,
              gc::checkpoint::Checkpointer* checkpointer, const gc::StateDict& state, gc::Stream& s) {
  const int signo = control.stop_signal();
  const std::string why =
      signo > 0 ? std::string("signal ") + strsignal(signo) : std::string("a notice to another rank");
  if (checkpointer == nullptr) {
    say(job.rank, "preempted by %s at step %d: no --checkpoint-dir, the run's steps are lost\n", why.c_str(), step);
    return gc::elastic::kPreemptedExitCode;
  }
  checkpointer->wait();  // the periodic save, if one is in flight (it may be this very step's)
  if (step % o.checkpoint_every != 0)
    checkpointer->save(step, state, s, {{"example", "train_mlp"}, {"dtype", o.dtype}, {"reason", "preemption"}});
  say(job.rank, "preempted by %s at step %d: checkpoint at step %d committed, exit %d to be requeued\n", why.c_str(),
      step, step, gc::elastic::kPreemptedExitCode);
  return gc::elastic::kPreemptedExitCode;
}

// The fp32 master weights (or the weights, in fp32 training) of rank 0, for comparing runs.
void dump(const std::string& path, const Model& m, gc::FusedAdam& adam, gc::Stream& s) {
  std::ofstream f(path, std::ios::binary);
  for (std::size_t p = 0; p < m.params.size(); ++p) {
    const gc::BufferView master = adam.master(p);
    const auto w = read_floats(master.empty() ? m.params[p].param : master, s);
    f.write(reinterpret_cast<const char*>(w.data()), static_cast<std::streamsize>(w.size() * 4));
  }
}

}  // namespace

int main(int argc, char** argv) try {
  const Options o = parse(argc, argv);
  // First: a preemption notice from here on stops the run at a step, with its state saved.
  gc::elastic::JobControl control;
  const gc::DType dtype = o.dtype == "fp16"   ? gc::DType::float16
                          : o.dtype == "bf16" ? gc::DType::bfloat16
                                              : gc::DType::float32;
  Job job = start_job(o);
  say(job.rank, "train_mlp: %d rank(s) on %s, %s, global batch %d, %d steps\n", job.size, job.dev.str().c_str(),
      gc::dtype_name(dtype), o.batch, o.steps);
  if (control.restart().count > 0)
    say(job.rank, "restart %d (%s)\n", control.restart().count, control.restart().reason.c_str());

  // Device allocations counted (for the memory-pool metrics): every buffer below comes through
  // this adaptor, which outlives them all; the default is restored when main returns.
  gc::StatisticsAdaptor memory_stats(gc::default_resource(gc::MemoryKind::device, job.dev));
  gc::set_default_resource(gc::MemoryKind::device, job.dev, &memory_stats);
  struct Restore {
    gc::Device dev;
    ~Restore() { gc::set_default_resource(gc::MemoryKind::device, dev, nullptr); }
  } restore{job.dev};
  gc::Stream s(job.dev);
  // Rank 0 watches its device's load (nvidia-smi's figures) for the progress lines and the summary.
  std::optional<gc::MetricsMonitor> monitor;
  if (job.rank == 0 || o.metrics_port >= 0) monitor.emplace(job.dev);
  std::optional<gc::telemetry::Exporter> metrics;
  if (o.metrics_port >= 0) metrics = serve_metrics(o, job, *monitor);

  // The model, fused AdamW with fp32 masters, the loss scaler (dynamic for fp16 only: bf16 and
  // fp32 need no loss scale), and the gradient buckets of several ranks (hierarchical across nodes).
  Model model = make_model(dtype, job.dev, s);
  gc::AdamOptions adam_options = gc::AdamOptions::adamw();
  adam_options.lr = o.lr;
  adam_options.weight_decay = 0.0f;
  gc::FusedAdam adam(model.params, adam_options, s);
  gc::LossScalerOptions scaler_options;
  scaler_options.dynamic = dtype == gc::DType::float16;
  if (!scaler_options.dynamic) scaler_options.init_scale = 1.0f;
  gc::LossScaler scaler(job.dev, s, scaler_options);
  std::unique_ptr<gc::GradBucketer> buckets;
  if (job.comm) {
    gc::BucketOptions bo;
    bo.hierarchical = job.comm->nodes() > 1 && job.comm->local_size() > 1;
    buckets = std::make_unique<gc::GradBucketer>(*job.comm, model.grads, bo);
    say(job.rank, "buckets: %zu, hierarchical all-reduce: %s (%d node(s) of %d)\n", buckets->bucket_count(),
        bo.hierarchical ? "yes" : "no", job.comm->nodes(), job.comm->local_size());
  }

  // Checkpoints: the state to save, and where a restarted run continues.
  gc::StateDict state = checkpoint_state(model, adam, scaler);
  std::optional<gc::checkpoint::Checkpointer> checkpointer;
  gc::checkpoint::PendingSave pending_save;
  if (!o.checkpoint_dir.empty()) {
    gc::checkpoint::Options co;
    co.keep_last = o.keep_last;
    co.comm = job.comm ? &*job.comm : nullptr;
    checkpointer.emplace(o.checkpoint_dir, co);
  }
  const int start = o.resume ? resume(o, job, state, adam, scaler, s) : 0;

  // The data: step s's batch, prefetched three ahead onto the device.
  const Teacher teacher;
  int produced = start;
  gc::Stream loader(gc::Device::host());
  gc::Prefetcher prefetcher(job.dev,
                            [&]() -> std::optional<gc::HostBatch> {
                              if (produced >= o.steps) return std::nullopt;
                              return make_batch(teacher, produced++, job.rank, job.local, dtype, loader);
                            },
                            {3, gc::MemoryKind::device});

  Activations act(job.local, dtype, job.dev);
  if (metrics && job.comm) metrics->detect_stragglers(*job.comm, s, {50, 0.2});
  Progress progress(o, job);
  for (int step = start; step < o.steps; ++step) {
    auto batch = progress.next_batch(prefetcher, s);
    if (!batch) break;
    if (job.rank == o.slow_rank) std::this_thread::sleep_for(std::chrono::milliseconds(o.slow_ms));
    const gc::BufferView x = batch->arrays()[0], y = batch->arrays()[1];
    forward_backward(model, act, x, y, job.local, scaler, buckets.get(), step == o.overflow_at, s);
    if (buckets) buckets->wait(s);
    // Unscale, skip on overflow (decided on the device), update the scale.
    scaler.unscale(model.grads, s);
    adam.step(s, &scaler);
    scaler.update(s);
    batch.reset();  // its memory returns to the pool in s's order
    progress.after_step(step, start, act.loss, scaler, adam, monitor ? &*monitor : nullptr,
                        metrics ? &*metrics : nullptr, memory_stats, s);
    if (checkpointer && (step + 1) % o.checkpoint_every == 0)
      save_checkpoint(o, job, step + 1, *checkpointer, state, pending_save, metrics ? &*metrics : nullptr, s);
    if (control.should_stop(step + 1, job.comm ? &*job.comm : nullptr, s))
      return preempted(o, job, control, step + 1, checkpointer ? &*checkpointer : nullptr, state, s);
  }
  if (checkpointer) checkpointer->wait();
  s.synchronize();
  progress.report(start, adam, monitor ? &*monitor : nullptr, s);
  if (!o.dump.empty() && job.rank == 0) dump(o.dump, model, adam, s);
  return 0;  // the target is reported, not enforced: short test runs stop before it
} catch (const std::exception& e) {
  std::fprintf(stderr, "train_mlp: %s\n", e.what());
  return 1;
}
