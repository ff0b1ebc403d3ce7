// fp32 host convolutions through oneDNN, and bf16 ones where the CPU has bf16 dot products (fp32
// accumulation, the output rounded once, as the model does). Each (pass, shape, layout, epilogue) gets its primitive
// once per calling thread (the stream worker; 64 kept), created with format `any` so oneDNN picks
// its blocked layouts, plus the reorders between the user's plain NCHW/NHWC tensors and those
// layouts (the blocked copies in per-thread arenas): a repeated convolution costs the reorders and
// the primitive, as PyTorch's (ideep's) convolution on plain tensors does.
#include "compute/conv/host/onednn_conv.hpp"

#include "compute/gemm/host/host_bf16_gemm.hpp"

#include <gpucloud/runtime/error.hpp>

#if GPUCLOUD_WITH_ONEDNN
#include "compute/host/onednn.hpp"
#include "compute/host/recent_cache.hpp"

#include <array>
#include <cstddef>
#include <memory>
#include <new>
#include <string>
#include <unordered_map>
#endif

namespace gpucloud::detail {

#if GPUCLOUD_WITH_ONEDNN

namespace {

using dims = dnnl::memory::dims;
using tag = dnnl::memory::format_tag;
using dt = dnnl::memory::data_type;

// One operand: the user's plain layout, the primitive's, and (when they differ) the reorder
// between the two; the blocked copy lives in the thread's arena for the call.
struct Operand {
  dnnl::memory::desc user, prim;
  dnnl::reorder to_prim, to_user;
  int arg = 0;
  bool reordered() const { return user != prim; }

  Operand(const dnnl::memory::desc& user_md, const dnnl::memory::desc& prim_md, int dnnl_arg, bool is_output)
      : user(user_md), prim(prim_md), arg(dnnl_arg) {
    if (!reordered()) return;
    if (is_output) {
      to_user = dnnl::reorder(dnnl::reorder::primitive_desc(onednn_engine(), prim, onednn_engine(), user));
    } else {
      to_prim = dnnl::reorder(dnnl::reorder::primitive_desc(onednn_engine(), user, onednn_engine(), prim));
    }
  }
};

// Grow-only, 64-byte aligned scratch of one calling thread for one operand's blocked copy: the
// largest convolution it ran bounds it, however many shapes are cached.
class Arena {
 public:
  void* get(std::size_t bytes) {
    if (bytes > size_) {
      data_.reset(static_cast<std::byte*>(::operator new (bytes, std::align_val_t{64})));
      size_ = bytes;
    }
    return data_.get();
  }

 private:
  struct Free {
    void operator()(std::byte* p) const { ::operator delete (p, std::align_val_t{64}); }
  };
  std::unique_ptr<std::byte, Free> data_;
  std::size_t size_ = 0;
};

using Key = ConvKey;

struct Cached {
  dnnl::primitive conv;
  std::vector<Operand> inputs;  // in1, in2
  Operand output;
  bool bias;
};

Cached build(const ConvPlan& p) {
  const auto& g = p.g;
  const dt type = p.dtype == DType::bfloat16 ? dt::bf16 : dt::f32;
  const tag act = g.nhwc ? tag::nhwc : tag::nchw;
  const dnnl::memory::desc x_user({g.n, g.c, g.h, g.w}, type, act);
  const dnnl::memory::desc y_user({g.n, g.k, g.oh, g.ow}, type, act);
  // Filters: KCRS (NCHW) or KRSC (NHWC); a group's filters are consecutive.
  const dnnl::memory::desc f_user =
      g.groups == 1 ? dnnl::memory::desc({g.k, g.c, g.r, g.s}, type, g.nhwc ? tag::ohwi : tag::oihw)
                    : dnnl::memory::desc({g.groups, g.kg(), g.cg(), g.r, g.s}, type, g.nhwc ? tag::gohwi : tag::goihw);
  const auto any = [&](const dnnl::memory::desc& d) { return dnnl::memory::desc(d.dims(), type, tag::any); };
  const dims strides{g.stride_h, g.stride_w}, dilates{g.dilation_h - 1, g.dilation_w - 1}, pad_l{g.pad_h, g.pad_w};
  // The far-side padding that makes the output oh x ow (less than pad when the stride skips it).
  const dims pad_r{(g.oh - 1) * g.stride_h + (g.r - 1) * g.dilation_h + 1 - g.h - g.pad_h,
                   (g.ow - 1) * g.stride_w + (g.s - 1) * g.dilation_w + 1 - g.w - g.pad_w};
  const dnnl::memory::desc bias_md({g.k}, type, tag::x);  // the output's dtype
  const auto algo = dnnl::algorithm::convolution_direct;
  const bool bias = p.pass == ConvPass::forward && p.has_bias;
  dnnl::primitive_attr attr;
  if (p.pass == ConvPass::forward && p.args.epilogue == Epilogue::bias_relu) {
    dnnl::post_ops ops;
    ops.append_eltwise(1.0f, dnnl::algorithm::eltwise_relu, 0.0f, 0.0f);
    attr.set_post_ops(ops);
  }
  const auto fwd_desc =
      bias ? dnnl::convolution_forward::desc(dnnl::prop_kind::forward_training, algo, any(x_user), any(f_user), bias_md,
                                             any(y_user), strides, dilates, pad_l, pad_r)
           : dnnl::convolution_forward::desc(dnnl::prop_kind::forward_training, algo, any(x_user), any(f_user),
                                             any(y_user), strides, dilates, pad_l, pad_r);
  const dnnl::convolution_forward::primitive_desc fwd(fwd_desc, attr, onednn_engine());
  switch (p.pass) {
    case ConvPass::forward:
      return {dnnl::convolution_forward(fwd),
              {Operand(x_user, fwd.src_desc(), DNNL_ARG_SRC, false),
               Operand(f_user, fwd.weights_desc(), DNNL_ARG_WEIGHTS, false)},
              Operand(y_user, fwd.dst_desc(), DNNL_ARG_DST, true),
              bias};
    case ConvPass::backward_data: {
      const dnnl::convolution_backward_data::primitive_desc bwd(
          dnnl::convolution_backward_data::desc(algo, any(x_user), any(f_user), any(y_user), strides, dilates, pad_l,
                                                pad_r),
          onednn_engine(), fwd);
      return {dnnl::convolution_backward_data(bwd),
              {Operand(y_user, bwd.diff_dst_desc(), DNNL_ARG_DIFF_DST, false),
               Operand(f_user, bwd.weights_desc(), DNNL_ARG_WEIGHTS, false)},
              Operand(x_user, bwd.diff_src_desc(), DNNL_ARG_DIFF_SRC, true),
              false};
    }
    case ConvPass::backward_filter:
    default: {
      const dnnl::convolution_backward_weights::primitive_desc bwd(
          dnnl::convolution_backward_weights::desc(algo, any(x_user), any(f_user), any(y_user), strides, dilates, pad_l,
                                                   pad_r),
          onednn_engine(), fwd);
      return {dnnl::convolution_backward_weights(bwd),
              {Operand(x_user, bwd.src_desc(), DNNL_ARG_SRC, false),
               Operand(y_user, bwd.diff_dst_desc(), DNNL_ARG_DIFF_DST, false)},
              Operand(f_user, bwd.diff_weights_desc(), DNNL_ARG_DIFF_WEIGHTS, true),
              false};
    }
  }
}

// ResNet-50 has about 20 distinct convolutions, 60 with their three passes.
constexpr std::size_t kCachedConvolutions = 64;

// The cached primitive for @p p, or nullptr when oneDNN refuses the shape (remembered).
Cached* cached(const ConvPlan& p) {
  thread_local RecentCache<Key, Cached, kCachedConvolutions> cache;
  thread_local RecentCache<Key, bool, kCachedConvolutions> refused;
  const Key key = conv_key(p);
  if (Cached* hit = cache.find(key)) return hit;
  if (refused.find(key) != nullptr) return nullptr;
  try {
    return &cache.insert(key, build(p));
  } catch (const dnnl::error& e) {
    if (e.status == dnnl_out_of_memory) throw_onednn_error("dnnl::convolution", e, __FILE__, __LINE__);
    refused.insert(key, true);  // unimplemented for this shape: the model runs it
    return nullptr;
  }
}

}  // namespace

bool onednn_conv(const ConvPlan& plan, BufferView out, BufferView in1, BufferView in2) {
  const bool bf16 = plan.dtype == DType::bfloat16 && host_bf16_gemm_available();  // native bf16 dot products
  if ((plan.dtype != DType::float32 && !bf16) || plan.args.alpha != 1.0f || plan.args.beta != 0.0f || plan.g.n == 0) {
    return false;
  }
  Cached* c = cached(plan);
  if (c == nullptr) return false;
  thread_local Arena arenas[3];  // in1, in2, out
  try {
    dnnl::stream s(onednn_engine());
    std::unordered_map<int, dnnl::memory> args;
    const BufferView ins[] = {in1, in2};
    for (std::size_t i = 0; i < 2; ++i) {
      Operand& op = c->inputs[i];
      dnnl::memory user(op.user, onednn_engine(), ins[i].data());
      if (!op.reordered()) {
        args.emplace(op.arg, user);
        continue;
      }
      dnnl::memory blocked(op.prim, onednn_engine(), arenas[i].get(op.prim.get_size()));
      op.to_prim.execute(s, user, blocked);
      args.emplace(op.arg, blocked);
    }
    dnnl::memory user_out(c->output.user, onednn_engine(), out.data());
    dnnl::memory blocked_out =
        c->output.reordered() ? dnnl::memory(c->output.prim, onednn_engine(), arenas[2].get(c->output.prim.get_size()))
                              : user_out;
    args.emplace(c->output.arg, blocked_out);
    if (c->bias) {
      args.emplace(DNNL_ARG_BIAS, dnnl::memory(dnnl::memory::desc({plan.g.k}, bf16 ? dt::bf16 : dt::f32, tag::x),
                                               onednn_engine(), plan.args.bias.data()));
    }
    c->conv.execute(s, args);
    if (c->output.reordered()) c->output.to_user.execute(s, blocked_out, user_out);
    s.wait();
  } catch (const dnnl::error& e) {
    throw_onednn_error("dnnl::convolution", e, __FILE__, __LINE__);
  }
  return true;
}

const char* host_conv_implementation() noexcept { return "oneDNN"; }

#else

bool onednn_conv(const ConvPlan&, BufferView, BufferView, BufferView) { return false; }

const char* host_conv_implementation() noexcept { return "im2col + GEMM"; }

#endif

}  // namespace gpucloud::detail
