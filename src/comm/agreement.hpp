// Internal: what every rank states before a collective, and the verdict when they differ (not
// API). The MPI and transport backends exchange these fields (as max and -min, in one
// all-reduce) so a mismatched collective is an error on every rank, never a wrong result or a hang.
#pragma once

#include <gpucloud/memory/buffer.hpp>

#include <cstdint>
#include <string>

namespace gpucloud::detail {

/// The collectives, as numbered in the agreement.
enum class Collective : std::int64_t {
  all_reduce = 1,
  hierarchical_all_reduce,
  reduce_scatter,
  all_gather,
  broadcast,
  barrier
};

/// What a rank is about to run.
struct Signature {
  Collective kind;
  std::int64_t op = -1;     // ReduceOp, -1 for none
  std::int64_t root = -1;   // broadcast's root, -1 for none
  std::int64_t count = 0;   // elements this rank contributes
  std::int64_t dtype = -1;  // DType, -1 for none
};

/// Fields in an agreement: the signature's five, and one a backend may use (MPI: inline data).
constexpr int kAgreementFields = 6;

/// The fields of @p sig with @p extra last.
void agreement_fields(const Signature& sig, std::int64_t extra, std::int64_t (&out)[kAgreementFields]);

/// Throws CommunicationError for @p call at @p where when the combined fields differ between
/// ranks: @p high holds each field's maximum over the ranks, @p low minus its minimum.
void check_agreement(const char* call, const std::string& where, const std::int64_t* high, const std::int64_t* low);

/// recv /= @p size, element by element in @p v's floating dtype (fp16/bf16 through fp32).
void divide_in_place(BufferView v, int size);

}  // namespace gpucloud::detail
