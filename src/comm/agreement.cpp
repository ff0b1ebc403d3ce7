#include "comm/agreement.hpp"

#include <gpucloud/comm/communicator.hpp>
#include <gpucloud/runtime/dtype.hpp>
#include <gpucloud/runtime/error.hpp>

#include "comm/host_reduce.hpp"

namespace gpucloud::detail {

namespace {

const char* collective_name(std::int64_t c) {
  switch (static_cast<Collective>(c)) {
    case Collective::all_reduce:
      return "all_reduce";
    case Collective::hierarchical_all_reduce:
      return "hierarchical_all_reduce";
    case Collective::reduce_scatter:
      return "reduce_scatter";
    case Collective::all_gather:
      return "all_gather";
    case Collective::broadcast:
      return "broadcast";
    case Collective::barrier:
      return "barrier";
  }
  return "?";
}

const char* reduce_op_name(std::int64_t op) {
  switch (static_cast<ReduceOp>(op)) {
    case ReduceOp::sum:
      return "sum";
    case ReduceOp::average:
      return "average";
    case ReduceOp::max:
      return "max";
    case ReduceOp::min:
      return "min";
  }
  return "none";
}

}  // namespace

void agreement_fields(const Signature& sig, std::int64_t extra, std::int64_t (&out)[kAgreementFields]) {
  const std::int64_t fields[kAgreementFields] = {
      static_cast<std::int64_t>(sig.kind), sig.op, sig.root, sig.count, sig.dtype, extra};
  for (int i = 0; i < kAgreementFields; ++i) out[i] = fields[i];
}

void check_agreement(const char* call, const std::string& where, const std::int64_t* high, const std::int64_t* low) {
  std::string why;
  auto differs = [&](int i) { return high[i] != -low[i]; };
  auto range = [&](int i, auto name) {
    return std::string(name(-low[i])) + " on some ranks, " + name(high[i]) + " on others";
  };
  auto number = [](std::int64_t v) { return std::to_string(v); };
  auto dtype = [](std::int64_t v) {
    return v < 0 ? std::string("none") : std::string(dtype_name(static_cast<DType>(v)));
  };
  if (differs(0)) why += "; operation: " + range(0, collective_name);
  if (differs(1)) why += "; reduce op: " + range(1, reduce_op_name);
  if (differs(2)) why += "; root: " + range(2, number);
  if (differs(3)) why += "; count: " + range(3, number);
  if (differs(4)) why += "; dtype: " + range(4, dtype);
  if (differs(5) && why.empty()) why += "; inline payload";
  if (!why.empty()) {
    throw CommunicationError(call,
                             where + ": the ranks disagree on the collective" + why +
                                 ". Nothing was exchanged; the communicator stays usable",
                             __FILE__, __LINE__);
  }
}

void divide_in_place(BufferView v, int size) {
  divide_elements(static_cast<unsigned char*>(v.data()), static_cast<std::int64_t>(v.size()), v.dtype(), size);
}

}  // namespace gpucloud::detail
