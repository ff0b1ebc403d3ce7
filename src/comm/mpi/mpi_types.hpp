// Internal: MPI set up for the MPI backend (initialised once, with MPI_THREAD_MULTIPLE), and the
// library's dtypes and reduce ops as MPI's: fp16 and bf16 as 2-byte types whose reductions add in
// fp32 (not API).
#pragma once

#include <gpucloud/comm/communicator.hpp>
#include <gpucloud/runtime/dtype.hpp>

#include <mpi.h>

namespace gpucloud::detail {

/// Initialises MPI once (MPI_THREAD_MULTIPLE, finalised at exit; a job whose communicator broke
/// ends with MPI_Abort instead) and makes the fp16/bf16 types and ops. @throws Unsupported when
/// MPI was initialised without MPI_THREAD_MULTIPLE.
void ensure_mpi();
/// MPI's datatype for @p t. @throws InvalidArgument naming @p call for a dtype collectives lack.
MPI_Datatype mpi_type(DType t, const char* call);
/// MPI's reduction for @p op over @p t (average sums; the caller divides).
MPI_Op mpi_op(ReduceOp op, DType t);

}  // namespace gpucloud::detail
