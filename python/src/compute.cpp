// GEMM, convolution, the small training ops and the spec table; shapes come from the arrays.
#include "interop.hpp"

#include <pybind11/stl.h>

namespace gpucloud::python {

namespace {

Epilogue to_epilogue(const std::string& name) {
  if (name == "none") return Epilogue::none;
  if (name == "bias") return Epilogue::bias;
  if (name == "relu") return Epilogue::relu;
  if (name == "bias_relu") return Epilogue::bias_relu;
  if (name == "gelu") return Epilogue::gelu;
  if (name == "bias_gelu") return Epilogue::bias_gelu;
  GPUCLOUD_FAIL(InvalidArgument, "gemm",
                "epilogue: '" + name + "' is not none, bias, relu, bias_relu, gelu or bias_gelu");
}

// (batch, rows, cols) of a 2-D or 3-D array.
std::array<std::int64_t, 3> matrix_shape(const Borrowed& b, const char* arg) {
  if (b.shape.size() == 2) return {1, b.shape[0], b.shape[1]};
  if (b.shape.size() == 3) return {b.shape[0], b.shape[1], b.shape[2]};
  GPUCLOUD_FAIL(InvalidArgument, "gemm",
                std::string(arg) + ": a 2-D matrix or a 3-D batch of matrices, got " + std::to_string(b.shape.size()) +
                    " dimensions");
}

// (h, w) from an int or a pair.
std::pair<std::int64_t, std::int64_t> pair_of(py::handle v, const char* arg) {
  const auto t = arg_ints(v, arg);
  if (t.size() == 1 && PyIndex_Check(v.ptr()) != 0) return {t[0], t[0]};
  GPUCLOUD_EXPECTS(t.size() == 2, "conv2d", std::string(arg) + ": an int or an (h, w) pair");
  return {t[0], t[1]};
}

std::int64_t dim(const std::vector<std::int64_t>& shape, const char* arg, std::size_t i) {
  GPUCLOUD_EXPECTS(shape.size() == 4, "conv2d",
                   std::string(arg) + ": a 4-D array, got " + std::to_string(shape.size()) + " dimensions");
  return shape[i];
}

// ConvArgs from x's and the filter's shapes (in the layout's order) and the keyword options.
ConvArgs conv_args(const std::vector<std::int64_t>& x, const std::vector<std::int64_t>& filter, IntOrPair stride,
                   IntOrPair padding, IntOrPair dilation, std::int64_t groups, const std::string& layout, float alpha,
                   float beta) {
  ConvArgs a;
  GPUCLOUD_EXPECTS(layout == "nchw" || layout == "nhwc", "conv2d", "layout: '" + layout + "' is not nchw or nhwc");
  const bool nhwc = layout == "nhwc";
  a.layout = nhwc ? ConvLayout::nhwc : ConvLayout::nchw;
  a.n = dim(x, "x", 0);
  a.c = dim(x, "x", nhwc ? 3 : 1);
  a.h = dim(x, "x", nhwc ? 1 : 2);
  a.w = dim(x, "x", nhwc ? 2 : 3);
  a.k = dim(filter, "filter", 0);
  a.r = dim(filter, "filter", nhwc ? 1 : 2);
  a.s = dim(filter, "filter", nhwc ? 2 : 3);
  const std::int64_t cg = dim(filter, "filter", nhwc ? 3 : 1);
  a.groups = groups;
  GPUCLOUD_EXPECTS(groups >= 1 && cg * groups == a.c, "conv2d",
                   "filter: " + std::to_string(cg) + " channels per filter times " + std::to_string(groups) +
                       " groups is not x's " + std::to_string(a.c) + " channels");
  std::tie(a.stride_h, a.stride_w) = pair_of(stride, "stride");
  std::tie(a.pad_h, a.pad_w) = pair_of(padding, "padding");
  std::tie(a.dilation_h, a.dilation_w) = pair_of(dilation, "dilation");
  a.alpha = alpha;
  a.beta = beta;
  return a;
}

// The output's shape in the layout's order.
std::vector<std::int64_t> y_shape(const ConvArgs& a) {
  const ConvOutputSize o = conv2d_output_size(a);
  if (a.layout == ConvLayout::nhwc) return {a.n, o.h, o.w, a.k};
  return {a.n, a.k, o.h, o.w};
}

void expect_shape(const Borrowed& b, const std::vector<std::int64_t>& want, const char* arg) {
  if (b.shape == want) return;
  std::string got, expected;
  for (auto v : b.shape) got += (got.empty() ? "" : ", ") + std::to_string(v);
  for (auto v : want) expected += (expected.empty() ? "" : ", ") + std::to_string(v);
  GPUCLOUD_FAIL(InvalidArgument, "conv2d",
                std::string(arg) + ": shape (" + got + "), the convolution gives (" + expected + ")");
}

void bind_conv(py::module_& m) {
  py::enum_<ConvLayout>(m, "ConvLayout", "Memory order of activations (and filters: KCRS or KRSC).")
      .value("nchw", ConvLayout::nchw)
      .value("nhwc", ConvLayout::nhwc);
  m.def(
      "conv2d_output_size",
      [](std::vector<std::int64_t> x, std::vector<std::int64_t> filter, IntOrPair stride, IntOrPair padding,
         IntOrPair dilation, std::int64_t groups, const std::string& layout) {
        return y_shape(conv_args(x, filter, stride, padding, dilation, groups, layout, 1.0f, 0.0f));
      },
      py::arg("x_shape"), py::arg("filter_shape"), py::kw_only(), py::arg("stride") = 1, py::arg("padding") = 0,
      py::arg("dilation") = 1, py::arg("groups") = 1, py::arg("layout") = "nchw",
      "The output's shape (in the layout's order) of a convolution of these shapes.");
  m.def(
      "conv2d_forward",
      [](ArrayLike y, ArrayLike x, ArrayLike filter, PyStream& stream, IntOrPair stride, IntOrPair padding,
         IntOrPair dilation, std::int64_t groups, const std::string& layout, float alpha, float beta,
         const std::string& epilogue, OptionalArrayLike bias) {
        Borrowed by = borrow_writable(y, "y"), bx = borrow(x, "x"), bf = borrow(filter, "filter");
        ConvArgs a = conv_args(bx.shape, bf.shape, stride, padding, dilation, groups, layout, alpha, beta);
        expect_shape(by, y_shape(a), "y");
        a.epilogue = to_epilogue(epilogue);
        std::vector<py::object> owners{by.owner, bx.owner, bf.owner};
        if (!bias.is_none()) {
          Borrowed bb = borrow(bias, "bias");
          a.bias = bb.view;
          owners.push_back(bb.owner);
        }
        enqueue_holding(stream.view, std::move(owners),
                        [&] { conv2d_forward(by.view, bx.view, bf.view, a, stream.view); });
      },
      py::arg("y"), py::arg("x"), py::arg("filter"), py::arg("stream"), py::kw_only(), py::arg("stride") = 1,
      py::arg("padding") = 0, py::arg("dilation") = 1, py::arg("groups") = 1, py::arg("layout") = "nchw",
      py::arg("alpha") = 1.0f, py::arg("beta") = 0.0f, py::arg("epilogue") = "none", py::arg("bias") = py::none(),
      "y = epilogue(alpha conv(x, filter) + beta y [+ bias]) in stream order (cross-correlation, as "
      "torch.nn.functional.conv2d); epilogue none, bias or bias_relu.");
  m.def(
      "conv2d_backward_data",
      [](ArrayLike dx, ArrayLike dy, ArrayLike filter, PyStream& stream, IntOrPair stride, IntOrPair padding,
         IntOrPair dilation, std::int64_t groups, const std::string& layout, float alpha, float beta) {
        Borrowed bdx = borrow_writable(dx, "dx"), bdy = borrow(dy, "dy"), bf = borrow(filter, "filter");
        const ConvArgs a = conv_args(bdx.shape, bf.shape, stride, padding, dilation, groups, layout, alpha, beta);
        expect_shape(bdy, y_shape(a), "dy");
        enqueue_holding(stream.view, {bdx.owner, bdy.owner, bf.owner},
                        [&] { conv2d_backward_data(bdx.view, bdy.view, bf.view, a, stream.view); });
      },
      py::arg("dx"), py::arg("dy"), py::arg("filter"), py::arg("stream"), py::kw_only(), py::arg("stride") = 1,
      py::arg("padding") = 0, py::arg("dilation") = 1, py::arg("groups") = 1, py::arg("layout") = "nchw",
      py::arg("alpha") = 1.0f, py::arg("beta") = 0.0f,
      "dx = alpha * (gradient of the convolution with respect to x, given dy) + beta dx.");
  m.def(
      "conv2d_backward_filter",
      [](ArrayLike dfilter, ArrayLike x, ArrayLike dy, PyStream& stream, IntOrPair stride, IntOrPair padding,
         IntOrPair dilation, std::int64_t groups, const std::string& layout, float alpha, float beta) {
        Borrowed bdf = borrow_writable(dfilter, "dfilter"), bx = borrow(x, "x"), bdy = borrow(dy, "dy");
        const ConvArgs a = conv_args(bx.shape, bdf.shape, stride, padding, dilation, groups, layout, alpha, beta);
        expect_shape(bdy, y_shape(a), "dy");
        enqueue_holding(stream.view, {bdf.owner, bx.owner, bdy.owner},
                        [&] { conv2d_backward_filter(bdf.view, bx.view, bdy.view, a, stream.view); });
      },
      py::arg("dfilter"), py::arg("x"), py::arg("dy"), py::arg("stream"), py::kw_only(), py::arg("stride") = 1,
      py::arg("padding") = 0, py::arg("dilation") = 1, py::arg("groups") = 1, py::arg("layout") = "nchw",
      py::arg("alpha") = 1.0f, py::arg("beta") = 0.0f,
      "dfilter = alpha * (gradient of the convolution with respect to the filter, summed over the batch) + beta "
      "dfilter.");
}

}  // namespace

void bind_compute(py::module_& m) {
  py::enum_<Precision>(m, "Precision", "The arithmetic of a GEMM.")
      .value("fp32", Precision::fp32)
      .value("tf32", Precision::tf32)
      .value("fp16", Precision::fp16)
      .value("bf16", Precision::bf16)
      .value("fp8", Precision::fp8);
  py::class_<GpuSpec>(m, "GpuSpec", "One row of the GPU spec table (dense rates).")
      .def_readonly("name", &GpuSpec::name)
      .def_readonly("sm", &GpuSpec::sm)
      .def_readonly("fp16_tflops", &GpuSpec::fp16_tflops)
      .def_readonly("bf16_tflops", &GpuSpec::bf16_tflops)
      .def_readonly("tf32_tflops", &GpuSpec::tf32_tflops)
      .def_readonly("fp32_tflops", &GpuSpec::fp32_tflops)
      .def_readonly("fp8_tflops", &GpuSpec::fp8_tflops)
      .def_readonly("memory_gb", &GpuSpec::memory_gb)
      .def_readonly("memory_bw_gbs", &GpuSpec::memory_bw_gbs)
      .def_readonly("nvlink_gbs", &GpuSpec::nvlink_gbs)
      .def_readonly("pcie_gen", &GpuSpec::pcie_gen)
      .def_readonly("tdp_watts", &GpuSpec::tdp_watts)
      .def_readonly("needs_cuda12", &GpuSpec::needs_cuda12)
      .def("__repr__", [](const GpuSpec& s) { return "GpuSpec('" + s.name + "')"; });
  m.def("gpu_specs", &gpu_specs, "The spec table: V100, T4, A100 40/80GB, A10, L4, RTX 4090, H100, H200.");
  m.def("find_gpu_spec", &find_gpu_spec, py::arg("device_name"), "The row matching a device name, or None.");
  m.def("peak_tflops", &peak_tflops, py::arg("spec"), py::arg("precision"), "Dense peak TFLOP/s in a precision.");
  m.def(
      "supports", [](DeviceLike device, Precision p) { return supports(to_device(device), p); }, py::arg("device"),
      py::arg("precision"), "Whether the device runs GEMMs in this precision.");

  m.def(
      "mse_loss",
      [](ArrayLike pred, ArrayLike target, ArrayLike loss, ArrayLike grad, PyStream& stream, py::object scaler) {
        // scaler: a gpucloud.LossScaler or None
        Borrowed p = borrow(pred, "pred"), t = borrow(target, "target"), l = borrow_writable(loss, "loss"),
                 g = borrow_writable(grad, "grad");
        const LossScaler* sc = nullptr;
        std::vector<py::object> owners{p.owner, t.owner, l.owner, g.owner};
        if (!scaler.is_none()) {
          sc = arg_as<PyScaler>(scaler, "scaler", "a gpucloud.LossScaler or None").scaler.get();
          owners.push_back(scaler);
        }
        enqueue_holding(stream.view, std::move(owners),
                        [&] { mse_loss(p.view, t.view, l.view, g.view, stream.view, sc); });
      },
      py::arg("pred"), py::arg("target"), py::arg("loss"), py::arg("grad"), py::arg("stream"),
      py::arg("scaler") = py::none(),
      "loss = mean((pred - target)^2); grad = 2 (pred - target) / N, times the scaler's scale when given.");
  m.def(
      "relu_backward",
      [](ArrayLike grad, ArrayLike activation, PyStream& stream) {
        Borrowed g = borrow_writable(grad, "grad"), a = borrow(activation, "activation");
        enqueue_holding(stream.view, {g.owner, a.owner}, [&] { relu_backward(g.view, a.view, stream.view); });
      },
      py::arg("grad"), py::arg("activation"), py::arg("stream"), "grad *= (activation > 0), in place.");
  m.def(
      "bias_grad",
      [](ArrayLike grad, ArrayLike out, PyStream& stream) {
        Borrowed g = borrow(grad, "grad"), o = borrow_writable(out, "bias_grad");
        const std::int64_t cols = static_cast<std::int64_t>(o.view.size());
        GPUCLOUD_EXPECTS(cols > 0 && g.view.size() % static_cast<std::size_t>(cols) == 0, "bias_grad",
                         "grad: its size is not a multiple of bias_grad's");
        const std::int64_t rows = static_cast<std::int64_t>(g.view.size()) / cols;
        enqueue_holding(stream.view, {g.owner, o.owner}, [&] { bias_grad(g.view, rows, cols, o.view, stream.view); });
      },
      py::arg("grad"), py::arg("bias_grad"), py::arg("stream"),
      "bias_grad[j] = sum over rows of grad[:, j] (grad is rows x len(bias_grad)).");
  m.def(
      "gemm",
      [](ArrayLike c, ArrayLike a, ArrayLike b, PyStream& stream, bool trans_a, bool trans_b, float alpha, float beta,
         const std::string& epilogue, OptionalArrayLike bias, bool tf32, float scale_a, float scale_b) {
        Borrowed bc = borrow_writable(c, "c"), ba = borrow(a, "a"), bb = borrow(b, "b");
        const auto sc = matrix_shape(bc, "c"), sa = matrix_shape(ba, "a"), sb = matrix_shape(bb, "b");
        GemmArgs g;
        g.m = sc[1];
        g.n = sc[2];
        g.k = trans_a ? sa[1] : sa[2];
        g.trans_a = trans_a ? Transpose::transpose : Transpose::none;
        g.trans_b = trans_b ? Transpose::transpose : Transpose::none;
        const std::int64_t a_rows = trans_a ? g.k : g.m, b_rows = trans_b ? g.n : g.k, b_cols = trans_b ? g.k : g.n;
        GPUCLOUD_EXPECTS(sa[1] == a_rows, "gemm",
                         "a: " + std::to_string(sa[1]) + " rows, op(a) must have c's " + std::to_string(g.m));
        GPUCLOUD_EXPECTS(sb[1] == b_rows && sb[2] == b_cols, "gemm",
                         "b: shape (" + std::to_string(sb[1]) + ", " + std::to_string(sb[2]) + ") does not give a " +
                             std::to_string(g.k) + " x " + std::to_string(g.n) + " op(b)");
        g.batch = sc[0];
        for (auto [s, name] : {std::pair{sa, "a"}, std::pair{sb, "b"}}) {
          GPUCLOUD_EXPECTS(s[0] == g.batch || s[0] == 1, "gemm",
                           std::string(name) + ": batch " + std::to_string(s[0]) + " is neither c's " +
                               std::to_string(g.batch) + " nor 1");
        }
        g.stride_a = sa[0] == 1 && g.batch > 1 ? 0 : -1;  // a single matrix serves every batch
        g.stride_b = sb[0] == 1 && g.batch > 1 ? 0 : -1;
        g.alpha = alpha;
        g.beta = beta;
        g.epilogue = to_epilogue(epilogue);
        g.tf32 = tf32;
        g.scale_a = scale_a;
        g.scale_b = scale_b;
        std::vector<py::object> owners{bc.owner, ba.owner, bb.owner};
        if (!bias.is_none()) {
          Borrowed bb2 = borrow(bias, "bias");
          g.bias = bb2.view;
          owners.push_back(bb2.owner);
        }
        enqueue_holding(stream.view, std::move(owners), [&] { gemm(bc.view, ba.view, bb.view, g, stream.view); });
      },
      py::arg("c"), py::arg("a"), py::arg("b"), py::arg("stream"), py::kw_only(), py::arg("trans_a") = false,
      py::arg("trans_b") = false, py::arg("alpha") = 1.0f, py::arg("beta") = 0.0f, py::arg("epilogue") = "none",
      py::arg("bias") = py::none(), py::arg("tf32") = false, py::arg("scale_a") = 1.0f, py::arg("scale_b") = 1.0f,
      "c = epilogue(alpha op(a) op(b) + beta c [+ bias]) in stream order; shapes from the arrays (2-D, or 3-D "
      "batches; a 2-D a or b serves every batch).");
  bind_conv(m);
}

}  // namespace gpucloud::python
