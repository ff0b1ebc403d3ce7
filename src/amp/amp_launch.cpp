#include "amp/amp_launch.hpp"

#include "runtime/host/host_stream.hpp"
#include "runtime/host/parallel_for.hpp"
#include "runtime/host/target_clones.hpp"
#include "runtime/stream_impl.hpp"

#include <algorithm>

namespace gpucloud::detail::amp {

namespace {
using namespace kernels;

bool on_gpu(StreamView s) { return s.device().is_cuda(); }

// A host launch runs on the caller when it moves at most kInPlaceBytes and the stream is idle
// (run_or_enqueue), and over the host's cores when its blocks hold at least two shares of
// kParallelShare elements (a share is worth more than waking a sleeping pool thread).
constexpr std::int64_t kParallelShare = 1 << 17;

// Elements a launch covers (every list the same).
template <int Depth>
std::int64_t launch_elements(const TensorListMeta<Depth>& meta) {
  std::int64_t n = 0;
  for (std::int32_t b = 0; b < meta.blocks; ++b) {
    const BlockChunk<Depth> c = chunk_of(meta, static_cast<std::uint32_t>(b));
    n += c.end - c.begin;
  }
  return n;
}

// Runs @p block(b, g) for every block b of @p meta, g its host grid (one thread per block, or the
// GPU's, host_walks_gpu_grid()), on the host stream @p s: in place when the launch moves at most
// kInPlaceBytes (@p bytes_per_element each) and the stream is idle (run_or_enqueue), and split over
// the host's cores when it is large (blocks own disjoint ranges and partial sums).
template <int Depth, class Block>
void host_blocks(StreamView s, const TensorListMeta<Depth>& meta, std::size_t bytes_per_element, Block block) {
  const std::int64_t elements = launch_elements(meta);
  const bool small = static_cast<std::size_t>(elements) * bytes_per_element <= detail::kInPlaceBytes;
  detail::run_or_enqueue(*s.impl(), small, [meta, block, elements] {
    const Grid g = host_block_grid(mta_grid(meta));
    auto run = [&](std::int64_t begin, std::int64_t end) {
      for (std::int64_t b = begin; b < end; ++b) block(static_cast<std::uint32_t>(b), g, meta);
    };
    const std::int64_t blocks = meta.blocks;
    if (elements < 2 * kParallelShare || blocks < 2) return run(0, blocks);
    detail::parallel_for(blocks, std::max<std::int64_t>(1, blocks * kParallelShare / elements), run);
  });
}

// Runs the multi-tensor @p body over @p meta on the host stream @p s (host_blocks).
template <int Depth, class Body>
void host_enqueue(StreamView s, const TensorListMeta<Depth>& meta, const Body& body) {
  host_blocks(s, meta, Depth * sizeof(float), [body](std::uint32_t b, Grid g, const TensorListMeta<Depth>& m) {
    for (std::uint32_t t = 0; t < g.threads; ++t) body(ThreadIndex{b, t}, g, m);
  });
}

// Runs @p fn, a step's scalar bookkeeping, on the host stream @p s (in place when it is idle).
template <class Fn>
void host_task(StreamView s, Fn fn) {
  detail::run_or_enqueue(*s.impl(), /*small=*/true, std::move(fn));
}

}  // namespace

// The optimizers' fp32 host loops, compiled for AVX-512, AVX2 and the baseline x86-64 (GCC's
// target_clones: the loader picks the CPU's version, as compute/host/host_loops.cpp does), every
// call inside inlined into each version (flatten). This file is compiled with -ffp-contract=off,
// so no version fuses a multiply-add the others round twice: the same results from every one.
// External linkage on purpose: the loader resolves a local ifunc while it relocates the library,
// before a sanitizer's runtime is up (ThreadSanitizer's instrumented resolver crashed there), a
// global one at its first call.
void sgd_host_loop(const SgdOp::HostLoop& loop);
void adam_host_loop(const AdamOp::HostLoop& loop, bool amsgrad);
GPUCLOUD_HOST_CLONES_FLATTEN void sgd_host_loop(const SgdOp::HostLoop& loop) { loop.op.dispatch(loop); }
GPUCLOUD_HOST_CLONES_FLATTEN void adam_host_loop(const AdamOp::HostLoop& loop, bool amsgrad) {
  loop.op.dispatch(loop, amsgrad);
}

}  // namespace gpucloud::detail::amp

namespace gpucloud::kernels {
void SgdOp::host_loop(const HostLoop& loop) { detail::amp::sgd_host_loop(loop); }
void AdamOp::host_loop(const HostLoop& loop, bool amsgrad) { detail::amp::adam_host_loop(loop, amsgrad); }
}  // namespace gpucloud::kernels

namespace gpucloud::detail::amp {

int unscale(const Rows1& grads, ScalerState* state, StreamView s) {
  return multi_tensor_apply<1>(grads, [&](const TensorListMeta<1>& meta) {
    if (on_gpu(s)) return cuda::amp_unscale(meta, state, *s.impl());
    host_enqueue(s, meta, ElementwiseBody<1, UnscaleOp>{UnscaleOp{state}});
  });
}

int scale_by(const Rows1& tensors, const float* factor, StreamView s) {
  return multi_tensor_apply<1>(tensors, [&](const TensorListMeta<1>& meta) {
    if (on_gpu(s)) return cuda::amp_scale_by(meta, factor, *s.impl());
    host_enqueue(s, meta, ElementwiseBody<1, ScaleByOp>{ScaleByOp{factor}});
  });
}

void update_scale(ScalerState* state, ScalerRule rule, StreamView s) {
  if (on_gpu(s)) return cuda::amp_update_scale(state, rule, *s.impl());
  host_task(s, [state, rule] { kernels::update_scale(state, rule); });
}

std::size_t partial_count(const Rows1& tensors) {
  std::size_t blocks = 0;
  for (const auto& row : tensors) {
    blocks += (row[0].size() + static_cast<std::size_t>(kChunkSize) - 1) / static_cast<std::size_t>(kChunkSize);
  }
  return blocks;
}

int sum_squares(const Rows1& tensors, float* partials, StreamView s) {
  std::size_t offset = 0;
  return multi_tensor_apply<1>(tensors, [&](const TensorListMeta<1>& meta) {
    float* out = partials + offset;
    offset += static_cast<std::size_t>(meta.blocks);
    if (on_gpu(s)) return cuda::amp_sum_squares(meta, out, *s.impl());
    host_blocks(s, meta, sizeof(float), [out](std::uint32_t b, Grid g, const TensorListMeta<1>& m) {
      float block_sum = 0.0f;  // each block reduces its threads' sums
      for (std::uint32_t t = 0; t < g.threads; ++t) block_sum += thread_sum_of_squares(ThreadIndex{b, t}, g, m);
      out[b] = block_sum;
    });
  });
}

void finish_norm(const float* partials, std::size_t count, float max_norm, float* norm, float* coef, StreamView s) {
  if (on_gpu(s)) return cuda::amp_finish_norm(partials, count, max_norm, norm, coef, *s.impl());
  host_task(s, [=] { kernels::finish_norm(partials, static_cast<std::int64_t>(count), max_norm, norm, coef); });
}

void begin_step(StepScalars* scalars, const float* found_inf, double lr, double beta1, double beta2, StreamView s) {
  if (on_gpu(s)) return cuda::amp_begin_step(scalars, found_inf, lr, beta1, beta2, *s.impl());
  host_task(s, [=] { kernels::begin_step(scalars, found_inf, lr, beta1, beta2); });
}

int sgd(const Rows4& rows, const SgdOp& op, StreamView s) {
  return multi_tensor_apply<4>(rows, [&](const TensorListMeta<4>& meta) {
    if (on_gpu(s)) return cuda::amp_sgd(meta, op, *s.impl());
    host_enqueue(s, meta, ElementwiseBody<4, SgdOp>{op});
  });
}

int adam(const Rows6& rows, const AdamOp& op, StreamView s) {
  return multi_tensor_apply<6>(rows, [&](const TensorListMeta<6>& meta) {
    if (on_gpu(s)) return cuda::amp_adam(meta, op, *s.impl());
    host_enqueue(s, meta, ElementwiseBody<6, AdamOp>{op});
  });
}

}  // namespace gpucloud::detail::amp
