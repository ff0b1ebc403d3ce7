// Internal: the element-wise reduction of the MPI backend's own schedules (the agreement's inline
// payloads, the ring, halving and doubling) and an average's division (MPI and transport
// backends), on host memory (not API).
#pragma once

#include <gpucloud/comm/communicator.hpp>
#include <gpucloud/runtime/dtype.hpp>

#include <cstdint>

namespace gpucloud::detail {

/// out[i] = partial[i] (op) mine[i] for @p n elements of @p t (@p out may be either input, exactly; no
/// alignment needed): fp16/bf16 through fp32, rounded once; integer sums wrap, as MPI_SUM's do; average
/// adds (the division comes after). One vectorised loop per dtype and op (AVX-512, AVX2 or the baseline,
/// picked at load time), bit for bit the scalar arithmetic.
void reduce_elements(const unsigned char* partial, const unsigned char* mine, unsigned char* out, std::int64_t n,
                     DType t, ReduceOp op);

/// data[i] = data[i] / @p size for @p n elements of the floating dtype @p t (an average's last step): the
/// element times 1 / size in fp64, rounded once to the dtype (fp16/bf16 widened to fp32 first); integer
/// dtypes are left alone. Vectorised like reduce_elements.
void divide_elements(unsigned char* data, std::int64_t n, DType t, int size);

}  // namespace gpucloud::detail
