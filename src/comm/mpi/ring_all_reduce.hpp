// Internal: the MPI backend's all-reduce for large messages (not API). A ring (reduce-scatter, then
// all-gather) over point-to-point messages, cut into segments that move concurrently, so the
// reduction of one segment overlaps the transfer of the others. Progressed by test() without
// blocking, so the caller's thread can run it against a timeout; OpenMPI's tuned MPI_Allreduce
// cannot be abandoned that way, and on this project's machine it is slower (docs/collectives.md).
#pragma once

#include <gpucloud/comm/communicator.hpp>
#include <gpucloud/runtime/dtype.hpp>

#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

namespace gpucloud::detail {

/// Whether an all-reduce of @p bytes over @p size ranks runs as a RingAllReduce (every rank
/// decides the same from the agreed count and dtype): from above the inline size on 2 ranks, from
/// (size - 1) MiB on more (below that the ring's 2 (size - 1) steps cost more than MPI's
/// latency-bound algorithms).
bool ring_all_reduce_applies(std::size_t bytes, int size);

/// Segments in flight at once, each in its own scratch slot and under its own message tag.
constexpr int kRingSlots = 16;
/// Bytes of one segment (and of one scratch slot).
constexpr std::size_t kRingSegmentBytes = std::size_t{64} << 10;
/// Bytes of the scratch one RingAllReduce uses.
constexpr std::size_t kRingScratchBytes = kRingSlots * kRingSegmentBytes;
/// The first message tag a ring uses (tags [kRingFirstTag, kRingFirstTag + kRingSlots)).
constexpr int kRingFirstTag = 1;

/// One all-reduce, recv = reduce(send) over the ranks of @p comm; send == recv is in place. Rank
/// r's block r of the vector (size blocks, the first count % size one element longer) is reduced
/// along the ring r+1, r+2, ..., r; each block is reduced once and copied to the others, so every
/// rank ends with the same bytes. Each block is cut into segments of kRingSegmentBytes; slot s
/// carries segments s, s + kRingSlots, ... through all 2 (size - 1) steps, one at a time. The
/// buffers and @p scratch (kRingScratchBytes) must stay put until the all-reduce completes, or
/// for ever if it is abandoned. Average is not divided here (the caller divides).
class RingAllReduce {
 public:
  RingAllReduce(const void* send, void* recv, std::int64_t count, DType t, ReduceOp op, MPI_Comm comm, int rank,
                int size, unsigned char* scratch);
  RingAllReduce(const RingAllReduce&) = delete;
  RingAllReduce& operator=(const RingAllReduce&) = delete;

  /// Progresses without blocking; true once this rank has the result.
  bool test();

 private:
  struct Slot {
    std::int64_t segment = 0;
    int step = 0;
    bool active = false;
    MPI_Request requests[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
  };
  void start(int slot, std::int64_t segment);
  void post(int slot);
  void completed(int slot);
  // Element offset and length of @p segment of block @p block.
  void piece(int block, std::int64_t segment, std::int64_t& offset, std::int64_t& length) const;
  int block(int k) const { return ((k % size_) + size_) % size_; }

  const unsigned char* send_;
  unsigned char* recv_;
  std::int64_t count_, segment_elems_, segments_ = 1;
  DType dtype_;
  ReduceOp op_;
  std::size_t elem_;
  MPI_Comm comm_;
  int rank_, size_, live_ = 0;
  unsigned char* scratch_;
  Slot slots_[kRingSlots];
};

/// out[i] = partial[i] (op) mine[i] for @p n elements of @p t (@p out may be @p mine): fp16/bf16 through fp32, rounded
/// once; integer sums wrap, as MPI_SUM's do.
void reduce_elements(const unsigned char* partial, const unsigned char* mine, unsigned char* out, std::int64_t n,
                     DType t, ReduceOp op);

}  // namespace gpucloud::detail
