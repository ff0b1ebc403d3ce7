// Internal: the host's whole-range loops for relu_backward, bias_grad and scaling (unscale, clipping), typed per dtype
// (the shared bodies read each element through a dtype switch) and vectorised, compiled in
// src/compute/host/host_loops.cpp for AVX-512, AVX2 and the baseline. The same arithmetic and
// order as the bodies: bit for bit their results. Host only.
#pragma once

#include <cstdint>

namespace gpucloud::kernels::host {

/// grad[i] = activation[i] > 0 ? grad[i] : 0, rounded back to grad's type (types: kF32/kF16/kBF16).
void relu_backward(void* grad, const void* act, std::uint8_t grad_t, std::uint8_t act_t, std::int64_t n);

/// out[j] = sum over rows of grad[i * cols + j] in fp32, each column's rows in order.
void bias_grad(const void* grad, void* out, std::uint8_t grad_t, std::uint8_t out_t, std::int64_t rows,
               std::int64_t cols);

/// The host GEMM's epilogue on @p rows rows of C (row stride @p ldc, @p n columns, fp32): v + bias
/// (bias may be null), then ReLU when @p relu; one pass, bias added before the clamp.
void bias_relu_rows(float* c, std::int64_t ldc, std::int64_t rows, std::int64_t n, const float* bias, bool relu);

/// x[i] = x[i] * factor, rounded back to x's type (kF32/kF16/kBF16), as UnscaleOp (the loss
/// scaler's 1 / scale) and ScaleByOp (a clipping coefficient) do element by element; true when any
/// x[i] was inf or NaN before.
bool scale_array(void* x, std::uint8_t type, std::int64_t n, float factor);

}  // namespace gpucloud::kernels::host
