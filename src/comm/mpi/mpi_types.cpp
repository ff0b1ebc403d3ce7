// MPI set up for the MPI backend, and the library's dtypes and reduce ops as MPI's.
#include "comm/mpi/mpi_types.hpp"

#include <gpucloud/runtime/error.hpp>

#include "comm/communicator_impl.hpp"
#include "comm/host_reduce.hpp"
#include "comm/mpi/mpi_check.hpp"

#include <cstdlib>
#include <mutex>
#include <string>

namespace gpucloud::detail {

// ---- fp16 / bf16 on MPI: 2-byte types and reductions that add in fp32 --------------------------

namespace {

struct NarrowTypes {
  MPI_Datatype f16 = MPI_DATATYPE_NULL, bf16 = MPI_DATATYPE_NULL;
  MPI_Op sum = MPI_OP_NULL, max = MPI_OP_NULL, min = MPI_OP_NULL;
};

NarrowTypes& narrow();

// MPI's user op over 2-byte fp16 / bf16 elements: inout = in (op) inout, widened, combined in
// fp32, rounded once (the ring's and the agreement's reduction).
void reduce_narrow(void* in, void* inout, int* len, MPI_Datatype* type, ReduceOp op) {
  detail::reduce_elements(static_cast<const unsigned char*>(in), static_cast<const unsigned char*>(inout),
                          static_cast<unsigned char*>(inout), *len,
                          *type == narrow().f16 ? DType::float16 : DType::bfloat16, op);
}

void narrow_sum(void* in, void* inout, int* len, MPI_Datatype* t) { reduce_narrow(in, inout, len, t, ReduceOp::sum); }
void narrow_max(void* in, void* inout, int* len, MPI_Datatype* t) { reduce_narrow(in, inout, len, t, ReduceOp::max); }
void narrow_min(void* in, void* inout, int* len, MPI_Datatype* t) { reduce_narrow(in, inout, len, t, ReduceOp::min); }

NarrowTypes& narrow() {
  static NarrowTypes t;
  return t;
}

}  // namespace

void ensure_mpi() {
  static std::once_flag once;
  std::call_once(once, [] {
    int initialized = 0;
    GPUCLOUD_MPI_CHECK(MPI_Initialized(&initialized));
    if (!initialized) {
      int provided = 0;
      GPUCLOUD_MPI_CHECK(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided));
      std::atexit([] {
        int finalized = 0;
        MPI_Finalized(&finalized);
        if (!finalized) MPI_Finalize();
      });
    }
    // Registered after the finalisation above, so it runs before it: a job with an abandoned
    // collective ends (MPI_Abort) instead of waiting in MPI_Finalize for the missing rank.
    std::atexit([] { detail::end_job_if_communicator_broke(); });
    int provided = 0;
    GPUCLOUD_MPI_CHECK(MPI_Query_thread(&provided));
    if (provided < MPI_THREAD_MULTIPLE) {
      GPUCLOUD_FAIL(Unsupported, "Communicator::mpi_world",
                    "MPI was initialised without MPI_THREAD_MULTIPLE, which stream workers need");
    }
    NarrowTypes& t = narrow();
    GPUCLOUD_MPI_CHECK(MPI_Type_contiguous(2, MPI_BYTE, &t.f16));
    GPUCLOUD_MPI_CHECK(MPI_Type_commit(&t.f16));
    GPUCLOUD_MPI_CHECK(MPI_Type_contiguous(2, MPI_BYTE, &t.bf16));
    GPUCLOUD_MPI_CHECK(MPI_Type_commit(&t.bf16));
    GPUCLOUD_MPI_CHECK(MPI_Op_create(&narrow_sum, 1, &t.sum));
    GPUCLOUD_MPI_CHECK(MPI_Op_create(&narrow_max, 1, &t.max));
    GPUCLOUD_MPI_CHECK(MPI_Op_create(&narrow_min, 1, &t.min));
  });
}

MPI_Datatype mpi_type(DType t, const char* call) {
  switch (t) {
    case DType::float32:
      return MPI_FLOAT;
    case DType::float64:
      return MPI_DOUBLE;
    case DType::int32:
      return MPI_INT32_T;
    case DType::int64:
      return MPI_INT64_T;
    case DType::float16:
      return narrow().f16;
    case DType::bfloat16:
      return narrow().bf16;
    case DType::uint8:
      return MPI_UINT8_T;
    default:
      break;
  }
  GPUCLOUD_FAIL(InvalidArgument, call, std::string("dtype: ") + dtype_name(t) + " is not supported by collectives");
}

MPI_Op mpi_op(ReduceOp op, DType t) {
  const bool narrow_type = t == DType::float16 || t == DType::bfloat16;
  switch (op) {
    case ReduceOp::sum:
    case ReduceOp::average:
      return narrow_type ? narrow().sum : MPI_SUM;
    case ReduceOp::max:
      return narrow_type ? narrow().max : MPI_MAX;
    case ReduceOp::min:
      return narrow_type ? narrow().min : MPI_MIN;
  }
  return MPI_SUM;
}

}  // namespace gpucloud::detail
