#include "amp/amp_launch.hpp"

#include "runtime/stream_impl.hpp"

namespace gpucloud::detail::amp {

namespace {
using namespace kernels;

bool on_gpu(StreamView s) { return s.device().is_cuda(); }

// Enqueues a host launch of @p body over @p meta on the host stream.
template <int Depth, class Body>
void host_enqueue(StreamView s, const TensorListMeta<Depth>& meta, const Body& body) {
  s.impl()->launch_host_func([meta, body] { host_launch_mta(meta, body); }, /*always_run=*/false);
}

template <class Fn>
void host_task(StreamView s, Fn fn) {
  s.impl()->launch_host_func(std::move(fn), /*always_run=*/false);
}
}  // namespace

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
    host_task(s, [meta, out] {
      const Grid g = host_block_grid(mta_grid(meta));
      for (std::uint32_t b = 0; b < g.blocks; ++b) {  // each block reduces its threads' sums
        float block_sum = 0.0f;
        for (std::uint32_t t = 0; t < g.threads; ++t) block_sum += thread_sum_of_squares(ThreadIndex{b, t}, g, meta);
        out[b] = block_sum;
      }
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
