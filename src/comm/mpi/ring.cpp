#include "comm/mpi/ring.hpp"

#include <gpucloud/runtime/error.hpp>

#include "comm/host_reduce.hpp"
#include "comm/mpi/mpi_check.hpp"

#include <algorithm>
#include <cstring>
#include <string>

namespace gpucloud::detail {

bool ring_applies(std::size_t bytes, int size, std::size_t inline_limit) {
  if (size < 2 || bytes <= inline_limit) return false;
  return size == 2 || bytes >= static_cast<std::size_t>(size - 2) * (std::size_t{512} << 10);
}

bool halving_applies(std::size_t bytes, int size, int nodes, std::size_t inline_limit) {
  const bool power_of_two = size >= 4 && size <= 16 && (size & (size - 1)) == 0;
  return power_of_two && bytes > inline_limit && (nodes > 1 || !ring_applies(bytes, size, inline_limit));
}

bool all_reduce_ring_applies(std::size_t bytes, int size, int nodes, std::size_t inline_limit) {
  if (halving_applies(bytes, size, nodes, inline_limit)) return false;
  if (ring_applies(bytes, size, inline_limit)) return true;
  if (nodes != 1 || size <= 2 || bytes <= inline_limit) return false;
  return bytes >= std::max(std::size_t{384} << 10, static_cast<std::size_t>(size - 2) * (std::size_t{256} << 10));
}

bool ring_applies_per_rank(std::size_t bytes, int size, int nodes, std::size_t inline_limit) {
  if (ring_applies(bytes, size, inline_limit)) return true;
  return nodes == 1 && size > 2 && bytes > inline_limit && !halving_applies(bytes, size, nodes, inline_limit);
}

bool tree_applies(std::size_t bytes, int size, std::size_t inline_limit) {
  return size > 2 && bytes > inline_limit && !ring_applies(bytes, size, inline_limit);
}

RingCollective::RingCollective(RingKind kind, const void* send, void* recv, std::int64_t count, DType t, ReduceOp op,
                               MPI_Comm comm, int rank, int size, unsigned char* scratch, int root, RingSteps steps,
                               bool one_node)
    : kind_(kind),
      send_(static_cast<const unsigned char*>(send)),
      recv_(static_cast<unsigned char*>(recv)),
      count_(count),
      dtype_(t),
      op_(op),
      elem_(dtype_size(t)),
      comm_(comm),
      rank_(rank),
      size_(size),
      root_(root),
      scratch_(scratch) {
  const bool halving = kind_ == RingKind::all_reduce_halving;
  // A halving step receives a segment of up to size / 2 blocks into the slot's scratch.
  segment_elems_ = static_cast<std::int64_t>((halving ? 4 * kRingSegmentBytes / size_ : kRingSegmentBytes) / elem_);
  const std::size_t bytes = static_cast<std::size_t>(count_) * elem_;
  // An all-gather starts from this rank's block in place; alone, every collective is a copy.
  if (kind_ == RingKind::all_gather && bytes != 0) std::memcpy(recv_ + rank_ * bytes, send_, bytes);
  if (size_ < 2) {
    if (kind_ != RingKind::all_gather && send_ != recv_ && bytes != 0) std::memcpy(recv_, send_, bytes);
    return;
  }
  while ((1 << log_size_) < size_) ++log_size_;  // ceil(log2 size)
  // An all-reduce's steps: the ring's 2 (size - 1), or halving's log2(size) then doubling's as many.
  const int half_steps = halving ? log_size_ : size_ - 1;
  first_step_ = kind_ == RingKind::all_gather ? size_ - 1 : 0;
  end_step_ = kind_ == RingKind::reduce_scatter ? size_ - 1 : 2 * half_steps;
  if (halving) {
    GPUCLOUD_EXPECTS(size_ <= kMaxHalvingRanks && (size_ & (size_ - 1)) == 0, "RingCollective",
                     "halving needs a power-of-two number of ranks up to 16, not " + std::to_string(size_));
  }
  if (steps != RingSteps::all) {
    GPUCLOUD_EXPECTS(kind_ == RingKind::all_reduce || halving, "RingCollective",
                     "only an all-reduce runs half its steps");
    if (steps == RingSteps::reduce_scatter_half) end_step_ = half_steps;
    if (steps == RingSteps::all_gather_half) first_step_ = half_steps;
  }
  if (kind_ == RingKind::broadcast) {  // step 0 receives from upstream, step 1 sends downstream
    const int d = block(rank_ - root_);
    first_step_ = d == 0 ? 1 : 0;
    end_step_ = d == size_ - 1 ? 1 : 2;
  }
  if (kind_ == RingKind::broadcast_tree) {  // from the step that receives (the root: 0) to the last
    const int d = block(rank_ - root_);
    while (d != 0 && (2 << first_step_) <= d) ++first_step_;
    end_step_ = log_size_;
  }
  const bool blocks = kind_ == RingKind::all_reduce || halving;
  const std::int64_t longest = blocks ? count_ / size_ + (count_ % size_ != 0 ? 1 : 0) : count_;
  segments_ = std::max<std::int64_t>(1, (longest + segment_elems_ - 1) / segment_elems_);
  contiguous_ = halving && one_node && segments_ == 1;
  for (int s = 0; s < kRingSlots && s < segments_; ++s) start(s, s);
}

void RingCollective::piece(int b, std::int64_t segment, std::int64_t& offset, std::int64_t& length) const {
  const bool whole = kind_ == RingKind::broadcast || kind_ == RingKind::broadcast_tree;
  std::int64_t begin = whole ? 0 : b * count_, len = count_;  // else equal blocks
  if (kind_ == RingKind::all_reduce || kind_ == RingKind::all_reduce_halving) ring_block(count_, size_, b, begin, len);
  const std::int64_t at = std::min(len, segment * segment_elems_);
  offset = begin + at;
  length = std::min(segment_elems_, len - at);
}

void RingCollective::start(int s, std::int64_t segment) {
  slots_[s].segment = segment;
  slots_[s].step = first_step_;
  slots_[s].active = true;
  ++live_;
  post(s);
}

// Step t < size - 1 (reduce-scatter): send block r - t - 1 (this rank's own data at t = 0, the
// partial result of step t - 1 after), receive block r - t - 2 into one of the slot's scratch
// halves. Step size - 1 + u (all-gather): send block r - u (at u = 0 the one this rank finished),
// receive block r - u - 1 into recv. Both messages of a step complete before the next is posted,
// so no buffer is written while a send still reads it.
void RingCollective::post(int s) {
  if (kind_ == RingKind::broadcast || kind_ == RingKind::broadcast_tree) return post_broadcast(s);
  if (kind_ == RingKind::all_reduce_halving) return post_halving(s);
  Slot& slot = slots_[s];
  const int t = slot.step, to = block(rank_ + 1), from = block(rank_ - 1), tag = kRingFirstTag + s;
  std::int64_t send_at = 0, send_n = 0, recv_at = 0, recv_n = 0;
  const unsigned char* source = nullptr;
  unsigned char* into = nullptr;
  if (t < size_ - 1) {
    piece(block(rank_ - t - 1), slot.segment, send_at, send_n);
    piece(block(rank_ - t - 2), slot.segment, recv_at, recv_n);
    if (t == 0) {
      source = send_ + static_cast<std::size_t>(send_at) * elem_;
    } else if (kind_ == RingKind::all_reduce) {  // partial results live in recv
      source = recv_ + static_cast<std::size_t>(send_at) * elem_;
    } else {  // reduce-scatter: in the half the last step reduced into
      source = half(s, t - 1);
    }
    into = half(s, t);
  } else {
    const int u = t - (size_ - 1);
    piece(block(rank_ - u), slot.segment, send_at, send_n);
    piece(block(rank_ - u - 1), slot.segment, recv_at, recv_n);
    source = recv_ + static_cast<std::size_t>(send_at) * elem_;
    into = recv_ + static_cast<std::size_t>(recv_at) * elem_;
  }
  const auto bytes = [this](std::int64_t n) { return static_cast<int>(static_cast<std::size_t>(n) * elem_); };
  GPUCLOUD_MPI_CHECK(MPI_Irecv(into, bytes(recv_n), MPI_BYTE, from, tag, comm_, &slot.requests[0]));
  GPUCLOUD_MPI_CHECK(MPI_Isend(source, bytes(send_n), MPI_BYTE, to, tag, comm_, &slot.requests[1]));
  slot.pending = 2;
}

// Halving step t < log2(size), mask = 1 << t: of the blocks this rank still reduces (those equal
// to it modulo mask), keep the ones equal to it modulo 2 mask and send the others (equal to
// rank ^ mask modulo 2 mask) to rank ^ mask, one message per block, received into the slot's
// scratch. Doubling step log2(size) + u, mask = size >> (u + 1): send the blocks this rank holds
// (equal to it modulo 2 mask), receive rank ^ mask's into recv. Low bits first while halving, so ranks numbered node by
// node exchange the large halves inside a node and only the small pieces across nodes (as MPI's Rabenseifner does).
// Both sides post a step's messages in block order: same-tag messages match in order.
void RingCollective::post_halving(int s) {
  Slot& slot = slots_[s];
  const int t = slot.step, tag = kRingFirstTag + s;
  const bool halving = t < log_size_;
  if (contiguous_) {  // high bits first while halving, low bits first while doubling: ranges
    const int mask = halving ? size_ >> (t + 1) : 1 << (t - log_size_), partner = rank_ ^ mask;
    std::int64_t keep_at = 0, keep_n = 0, give_at = 0, give_n = 0;
    range(rank_, mask, keep_at, keep_n);
    range(partner, mask, give_at, give_n);
    const auto bytes = [this](std::int64_t n) { return static_cast<int>(static_cast<std::size_t>(n) * elem_); };
    const auto at = [this](std::int64_t i) { return static_cast<std::size_t>(i) * elem_; };
    if (halving) {  // the partner's values of the range kept, into the scratch; ours of the range it keeps
      GPUCLOUD_MPI_CHECK(MPI_Irecv(half(s, 0), bytes(keep_n), MPI_BYTE, partner, tag, comm_, &slot.requests[0]));
      GPUCLOUD_MPI_CHECK(MPI_Isend((t == 0 ? send_ : recv_) + at(give_at), bytes(give_n), MPI_BYTE, partner, tag, comm_,
                                   &slot.requests[1]));
    } else {  // the range held, for the partner's
      GPUCLOUD_MPI_CHECK(
          MPI_Irecv(recv_ + at(give_at), bytes(give_n), MPI_BYTE, partner, tag, comm_, &slot.requests[0]));
      GPUCLOUD_MPI_CHECK(
          MPI_Isend(recv_ + at(keep_at), bytes(keep_n), MPI_BYTE, partner, tag, comm_, &slot.requests[1]));
    }
    slot.pending = 2;
    return;
  }
  const int mask = halving ? 1 << t : size_ >> (t - log_size_ + 1), partner = rank_ ^ mask, stride = 2 * mask;
  const int m = size_ / stride, into = (halving ? rank_ : partner) & (stride - 1);
  const int from = (halving ? partner : rank_) & (stride - 1);
  const unsigned char* source = halving && t == 0 ? send_ : recv_;
  slot.pending = 0;
  for (int i = 0; i < m; ++i) {
    std::int64_t at = 0, n = 0;
    piece(into + i * stride, slot.segment, at, n);
    unsigned char* to = halving ? half(s, 0) + static_cast<std::size_t>(i * segment_elems_) * elem_
                                : recv_ + static_cast<std::size_t>(at) * elem_;
    GPUCLOUD_MPI_CHECK(MPI_Irecv(to, static_cast<int>(static_cast<std::size_t>(n) * elem_), MPI_BYTE, partner, tag,
                                 comm_, &slot.requests[slot.pending++]));
  }
  for (int i = 0; i < m; ++i) {
    std::int64_t at = 0, n = 0;
    piece(from + i * stride, slot.segment, at, n);
    GPUCLOUD_MPI_CHECK(MPI_Isend(source + static_cast<std::size_t>(at) * elem_,
                                 static_cast<int>(static_cast<std::size_t>(n) * elem_), MPI_BYTE, partner, tag, comm_,
                                 &slot.requests[slot.pending++]));
  }
}

void RingCollective::range(int b, int mask, std::int64_t& offset, std::int64_t& length) const {
  std::int64_t n = 0, last = 0;
  piece(b & ~(mask - 1), 0, offset, n);
  piece((b & ~(mask - 1)) + mask - 1, 0, last, n);
  length = last + n - offset;
}

// A halving step's blocks arrived: each reduced with this rank's (its input at step 0, its partial
// result after) into recv.
void RingCollective::completed_halving(int s) {
  Slot& slot = slots_[s];
  const int t = slot.step;
  if (t >= log_size_) return;
  if (contiguous_) {  // the range kept: the partner's values (scratch) with this rank's
    std::int64_t at = 0, n = 0;
    range(rank_, size_ >> (t + 1), at, n);
    const std::size_t offset = static_cast<std::size_t>(at) * elem_;
    reduce_elements(half(s, 0), (t == 0 ? send_ : recv_) + offset, recv_ + offset, n, dtype_, op_);
    return;
  }
  const int stride = 2 << t, m = size_ / stride, first = rank_ & (stride - 1);
  const unsigned char* mine = t == 0 ? send_ : recv_;
  for (int i = 0; i < m; ++i) {
    std::int64_t at = 0, n = 0;
    piece(first + i * stride, slot.segment, at, n);
    const std::size_t offset = static_cast<std::size_t>(at) * elem_;
    reduce_elements(half(s, 0) + static_cast<std::size_t>(i * segment_elems_) * elem_, mine + offset, recv_ + offset, n,
                    dtype_, op_);
  }
}

// A broadcast's segment. Along the chain: received from the rank before (step 0), then sent to
// the next (step 1). Along the binomial tree, step t: the rank at distance d from the root receives
// it at the step where 2^t <= d < 2^(t + 1), from d - 2^t; at every later step (the root: from
// step 0) it sends to d + 2^t, when that rank exists. A step with no message completes at the next test.
void RingCollective::post_broadcast(int s) {
  Slot& slot = slots_[s];
  std::int64_t at = 0, n = 0;
  piece(0, slot.segment, at, n);
  unsigned char* data = recv_ + static_cast<std::size_t>(at) * elem_;
  const int bytes = static_cast<int>(static_cast<std::size_t>(n) * elem_), tag = kRingFirstTag + s;
  int from = -1, to = -1;
  if (kind_ == RingKind::broadcast) {
    (slot.step == 0 ? from : to) = block(rank_ + (slot.step == 0 ? -1 : 1));
  } else {
    const int d = block(rank_ - root_), distance = 1 << slot.step;
    if (d >= distance) {  // (and d < 2 distance): the first step this rank takes
      from = block(rank_ - distance);
    } else if (d + distance < size_) {
      to = block(rank_ + distance);
    }
  }
  slot.pending = 0;
  if (from >= 0) GPUCLOUD_MPI_CHECK(MPI_Irecv(data, bytes, MPI_BYTE, from, tag, comm_, &slot.requests[slot.pending++]));
  if (to >= 0) GPUCLOUD_MPI_CHECK(MPI_Isend(data, bytes, MPI_BYTE, to, tag, comm_, &slot.requests[slot.pending++]));
}

void RingCollective::completed(int s) {
  Slot& slot = slots_[s];
  const int t = slot.step;
  if (kind_ == RingKind::all_reduce_halving) {
    completed_halving(s);
  } else if (kind_ != RingKind::broadcast && kind_ != RingKind::broadcast_tree &&
             t < size_ - 1) {  // the partial result upstream, then this rank's share
    std::int64_t at = 0, n = 0;
    piece(block(rank_ - t - 2), slot.segment, at, n);
    const std::size_t offset = static_cast<std::size_t>(at) * elem_;
    unsigned char* out = recv_ + offset;
    if (kind_ == RingKind::reduce_scatter) {  // into the half it came in, this rank's block into recv
      out = t == size_ - 2 ? recv_ + offset - static_cast<std::size_t>(rank_ * count_) * elem_ : half(s, t);
    }
    reduce_elements(half(s, t), send_ + offset, out, n, dtype_, op_);
  }
  if (++slot.step < end_step_) return post(s);
  slot.active = false;
  --live_;
  if (slot.segment + kRingSlots < segments_) start(s, slot.segment + kRingSlots);
}

bool RingCollective::test() {
  for (int s = 0; s < kRingSlots; ++s) {
    if (!slots_[s].active) continue;
    int complete = 0;
    GPUCLOUD_MPI_CHECK(MPI_Testall(slots_[s].pending, slots_[s].requests, &complete, MPI_STATUSES_IGNORE));
    if (complete) completed(s);
  }
  return live_ == 0;
}

bool all_reduce_direct_applies(std::size_t bytes, int size, int nodes, std::size_t inline_limit) {
  return direct_applies(bytes, size, nodes, inline_limit) && all_reduce_ring_applies(bytes, size, nodes, inline_limit);
}

std::size_t DirectAllReduce::workspace_bytes(std::int64_t count, DType t, int size) {
  const std::int64_t longest = count / size + (count % size != 0 ? 1 : 0);
  return static_cast<std::size_t>(size - 1) * static_cast<std::size_t>(longest) * dtype_size(t);
}

DirectAllReduce::DirectAllReduce(const void* send, void* recv, std::int64_t count, DType t, ReduceOp op, MPI_Comm comm,
                                 int rank, int size, unsigned char* workspace, bool scatter_only, bool values_sent)
    : send_(static_cast<const unsigned char*>(send)),
      recv_(static_cast<unsigned char*>(recv)),
      count_(count),
      dtype_(t),
      op_(op),
      elem_(dtype_size(t)),
      comm_(comm),
      rank_(rank),
      size_(size),
      workspace_(workspace),
      scatter_only_(scatter_only) {
  GPUCLOUD_EXPECTS(size_ > 2 && size_ <= 16, "DirectAllReduce", "needs 3 to 16 ranks, not " + std::to_string(size_));
  const auto bytes = [this](std::int64_t n) { return static_cast<int>(static_cast<std::size_t>(n) * elem_); };
  std::int64_t mine_at = 0, mine_n = 0;
  block(rank_, mine_at, mine_n);
  receives_.resize(static_cast<std::size_t>(size_ - 1));
  sends_.resize(static_cast<std::size_t>(size_ - 1), MPI_REQUEST_NULL);
  for (int k = 1; k < size_; ++k) {  // the nearest ranks first: their values are reduced first
    const int q = (rank_ + k) % size_;
    GPUCLOUD_MPI_CHECK(MPI_Irecv(slot(q), bytes(mine_n), MPI_BYTE, q, kDirectTag, comm_, &receives_[k - 1]));
  }
  for (int k = 1; k < size_ && !values_sent; ++k) {  // each rank's block of this rank's values to it
    const int q = (rank_ + size_ - k) % size_;
    std::int64_t at = 0, n = 0;
    block(q, at, n);
    GPUCLOUD_MPI_CHECK(MPI_Isend(send_ + static_cast<std::size_t>(at) * elem_, bytes(n), MPI_BYTE, q, kDirectTag, comm_,
                                 &sends_[k - 1]));
  }
}

void DirectAllReduce::block(int b, std::int64_t& offset, std::int64_t& length) const {
  ring_block(count_, size_, b, offset, length);
}

unsigned char* DirectAllReduce::slot(int q) const {
  const int k = (q - rank_ + size_) % size_;  // 1 .. size - 1
  const std::int64_t longest = count_ / size_ + (count_ % size_ != 0 ? 1 : 0);
  return workspace_ + static_cast<std::size_t>(k - 1) * static_cast<std::size_t>(longest) * elem_;
}

// Block rank_ as the ring reduces it: rank + 1's values with rank + 2's, that with rank + 3's, ...,
// this rank's own last, each partial result the first operand (in the slot of rank + 1).
void DirectAllReduce::reduce() {
  std::int64_t at = 0, n = 0;
  block(rank_, at, n);
  unsigned char* partial = slot((rank_ + 1) % size_);
  for (int k = 2; k < size_; ++k) reduce_elements(partial, slot((rank_ + k) % size_), partial, n, dtype_, op_);
  const std::size_t offset = static_cast<std::size_t>(at) * elem_;
  reduce_elements(partial, send_ + offset, recv_ + (scatter_only_ ? 0 : offset), n, dtype_, op_);
}

// This rank's result to every rank, theirs into recv (this rank's sends of its values have
// completed: in place those are the bytes the results land on).
void DirectAllReduce::gather() {
  const auto bytes = [this](std::int64_t n) { return static_cast<int>(static_cast<std::size_t>(n) * elem_); };
  std::int64_t mine_at = 0, mine_n = 0;
  block(rank_, mine_at, mine_n);
  for (int k = 1; k < size_; ++k) {
    const int q = (rank_ + k) % size_;
    std::int64_t at = 0, n = 0;
    block(q, at, n);
    GPUCLOUD_MPI_CHECK(MPI_Irecv(recv_ + static_cast<std::size_t>(at) * elem_, bytes(n), MPI_BYTE, q, kDirectTag, comm_,
                                 &receives_[k - 1]));
  }
  for (int k = 1; k < size_; ++k) {
    const int q = (rank_ + size_ - k) % size_;
    GPUCLOUD_MPI_CHECK(MPI_Isend(recv_ + static_cast<std::size_t>(mine_at) * elem_, bytes(mine_n), MPI_BYTE, q,
                                 kDirectTag, comm_, &sends_[k - 1]));
  }
}

bool DirectAllReduce::test() {
  const auto done = [](std::vector<MPI_Request>& r) {
    int complete = 0;
    GPUCLOUD_MPI_CHECK(MPI_Testall(static_cast<int>(r.size()), r.data(), &complete, MPI_STATUSES_IGNORE));
    return complete != 0;
  };
  if (phase_ == 0) {  // the other ranks' values of this rank's block
    if (!done(receives_)) {
      (void)done(sends_);
      return false;
    }
    reduce();
    phase_ = 1;
  }
  if (phase_ == 1) {  // this rank's values sent: the results may land
    if (!done(sends_)) return false;
    if (scatter_only_) {
      phase_ = 2;
      return true;
    }
    gather();
    phase_ = 2;
  }
  const bool sent = done(sends_);
  return done(receives_) && sent;
}

bool direct_applies(std::size_t bytes, int size, int nodes, std::size_t inline_limit) {
  return size > 2 && size <= 16 && nodes == 1 && bytes > inline_limit && bytes <= 2 * kDirectPieceBytes;
}

bool two_rank_all_reduce_applies(std::size_t bytes, int size, std::size_t inline_limit) {
  return size == 2 && bytes > inline_limit && bytes <= 2 * kDirectPieceBytes;
}

void ring_block(std::int64_t count, int size, int r, std::int64_t& offset, std::int64_t& length) {
  const std::int64_t q = count / size, m = count % size;
  offset = r * q + std::min<std::int64_t>(r, m);
  length = q + (r < m ? 1 : 0);
}

DirectTransfer::DirectTransfer(const void* send, void* recv, std::size_t bytes, int peer, MPI_Comm comm) {
  requests_.resize(std::max<std::size_t>(1, (bytes + kDirectPieceBytes - 1) / kDirectPieceBytes));
  for (std::size_t i = 0; i < requests_.size(); ++i) {
    const std::size_t offset = i * kDirectPieceBytes;
    const int n = static_cast<int>(std::min(kDirectPieceBytes, bytes - offset));
    if (send != nullptr) {
      GPUCLOUD_MPI_CHECK(MPI_Isend(static_cast<const unsigned char*>(send) + offset, n, MPI_BYTE, peer, kDirectTag,
                                   comm, &requests_[i]));
    } else {
      GPUCLOUD_MPI_CHECK(
          MPI_Irecv(static_cast<unsigned char*>(recv) + offset, n, MPI_BYTE, peer, kDirectTag, comm, &requests_[i]));
    }
  }
}

bool DirectTransfer::test() {
  int complete = 0;
  GPUCLOUD_MPI_CHECK(MPI_Testall(static_cast<int>(requests_.size()), requests_.data(), &complete, MPI_STATUSES_IGNORE));
  return complete != 0;
}

}  // namespace gpucloud::detail
