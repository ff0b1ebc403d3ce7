// Multi-tensor apply: many tensors (of mixed dtypes) processed by one launch. The launch
// metadata (tensor addresses, sizes, dtypes and a block -> (tensor, chunk) map) is packed on the
// host into a struct passed by value as the kernel argument, as apex's multi_tensor_apply does;
// the host backend walks the same blocks with the same metadata.
#pragma once

#include <gpucloud/detail/float_bits.hpp>
#include <gpucloud/detail/hd.hpp>
#include <gpucloud/memory/buffer.hpp>

#include "kernels/launch/launch.hpp"

#include <algorithm>
#include <array>
#include <cstdint>
#include <utility>
#include <vector>

namespace gpucloud::kernels {

/// Elements one block processes (one chunk).
inline constexpr std::int64_t kChunkSize = 65536;
/// Blocks per launch.
inline constexpr int kMaxBlocks = 320;
/// Threads per block.
inline constexpr std::uint32_t kMtaThreads = 512;

/// Tensors per launch for a given number of lists, so the metadata stays under 4 KiB.
template <int Depth>
constexpr int max_tensors() {
  return Depth == 1 ? 110 : Depth == 2 ? 64 : Depth == 3 ? 48 : Depth == 4 ? 36 : Depth == 5 ? 30 : 24;
}

/// Element type codes in the metadata (a subset of DType: what gradients and weights use).
enum ElemType : std::uint8_t { kF32 = 0, kF16 = 1, kBF16 = 2, kNone = 255 };

/// Launch metadata for Depth parallel lists of tensors (e.g. params, grads, moments).
template <int Depth>
struct TensorListMeta {
  void* addresses[Depth][max_tensors<Depth>()];
  std::int64_t sizes[max_tensors<Depth>()];
  std::uint8_t types[Depth][max_tensors<Depth>()];
  std::uint8_t block_to_tensor[kMaxBlocks];
  std::int32_t block_to_chunk[kMaxBlocks];
  std::int32_t blocks;
};
static_assert(sizeof(TensorListMeta<1>) < 4000 && sizeof(TensorListMeta<6>) < 4000, "kernel parameter limit");

GPUCLOUD_HD inline bool is_finite(float x) { return (detail::float_as_bits(x) & 0x7f800000u) != 0x7f800000u; }

/// Reads element i of a tensor of type t as float.
GPUCLOUD_HD inline float load(const void* p, std::int64_t i, std::uint8_t t) {
  if (t == kF16) return detail::half_bits_to_float(static_cast<const std::uint16_t*>(p)[i]);
  if (t == kBF16) return detail::bfloat16_bits_to_float(static_cast<const std::uint16_t*>(p)[i]);
  return static_cast<const float*>(p)[i];
}

/// Writes v, rounded to nearest even, as element i of a tensor of type t.
GPUCLOUD_HD inline void store(void* p, std::int64_t i, std::uint8_t t, float v) {
  if (t == kF16) {
    static_cast<std::uint16_t*>(p)[i] = detail::float_to_half_bits(v);
  } else if (t == kBF16) {
    static_cast<std::uint16_t*>(p)[i] = detail::float_to_bfloat16_bits(v);
  } else {
    static_cast<float*>(p)[i] = v;
  }
}

/// The chunk of block b: tensor slot and [begin, end) element range.
template <int Depth>
struct BlockChunk {
  int slot;
  std::int64_t begin;
  std::int64_t end;
};

template <int Depth>
GPUCLOUD_HD inline BlockChunk<Depth> chunk_of(const TensorListMeta<Depth>& meta, std::uint32_t block) {
  const int slot = meta.block_to_tensor[block];
  const std::int64_t begin = static_cast<std::int64_t>(meta.block_to_chunk[block]) * kChunkSize;
  const std::int64_t end = begin + kChunkSize < meta.sizes[slot] ? begin + kChunkSize : meta.sizes[slot];
  return BlockChunk<Depth>{slot, begin, end};
}

/// Whether Op has host_range(meta, slot, begin, end): the host's contiguous walk of a chunk, the
/// same per-element math with its dtype dispatch hoisted out of the loop so it vectorises.
template <class Op, int Depth>
constexpr auto has_host_range(int)
    -> decltype(std::declval<const Op&>().host_range(std::declval<const TensorListMeta<Depth>&>(), 0, std::int64_t{},
                                                     std::int64_t{}),
                bool()) {
  return true;
}
template <class Op, int Depth>
constexpr bool has_host_range(long) {
  return false;
}

/// Runs an element op over every element of every tensor: the body of a multi-tensor kernel.
/// Op: GPUCLOUD_HD void operator()(const TensorListMeta<Depth>&, int slot, std::int64_t i) const,
/// and GPUCLOUD_HD bool skip() const (true: the whole step is skipped, e.g. found-inf is set).
template <int Depth, class Op>
struct ElementwiseBody {
  Op op;
  GPUCLOUD_HD void operator()(ThreadIndex t, Grid g, const TensorListMeta<Depth>& meta) const {
    if (static_cast<std::int32_t>(t.block) >= meta.blocks || op.skip()) return;
    const BlockChunk<Depth> c = chunk_of(meta, t.block);
#if !defined(__CUDA_ARCH__)
    if constexpr (has_host_range<Op, Depth>(0)) {  // one host thread walks the whole chunk
      if (g.threads == 1) return op.host_range(meta, c.slot, c.begin, c.end);
    }
#endif
    for (std::int64_t i = c.begin + t.thread; i < c.end; i += g.threads) op(meta, c.slot, i);
  }
};

/// Packs @p tensors (each a row of Depth views; rows of zero size are skipped) into launches
/// and calls @p launch(meta) for each; returns the number of launches.
template <int Depth, class Launch>
int multi_tensor_apply(const std::vector<std::array<BufferView, Depth>>& tensors, Launch&& launch) {
  TensorListMeta<Depth> meta{};
  int slot = 0, launches = 0;
  meta.blocks = 0;
  auto type_of = [](const BufferView& v) -> std::uint8_t {
    if (v.data() == nullptr && v.empty()) return kNone;
    return v.dtype() == DType::float16 ? kF16 : v.dtype() == DType::bfloat16 ? kBF16 : kF32;
  };
  for (const auto& row : tensors) {
    const std::int64_t size = static_cast<std::int64_t>(row[0].size());
    if (size == 0) continue;
    for (int d = 0; d < Depth; ++d) {
      meta.addresses[d][slot] = row[d].data();
      meta.types[d][slot] = type_of(row[d]);
    }
    meta.sizes[slot] = size;
    const std::int64_t chunks = (size + kChunkSize - 1) / kChunkSize;
    for (std::int64_t c = 0; c < chunks; ++c) {
      meta.block_to_tensor[meta.blocks] = static_cast<std::uint8_t>(slot);
      meta.block_to_chunk[meta.blocks] = static_cast<std::int32_t>(c);
      ++meta.blocks;
      const bool last_chunk = c == chunks - 1;
      const bool tensors_full = slot + 1 == max_tensors<Depth>() && last_chunk;
      if (tensors_full || meta.blocks == kMaxBlocks) {
        launch(meta);
        ++launches;
        meta.blocks = 0;
        if (last_chunk) {
          slot = -1;  // the next tensor starts a fresh launch
        } else {      // the rest of this tensor continues in slot 0 of a fresh launch
          for (int d = 0; d < Depth; ++d) {
            meta.addresses[d][0] = meta.addresses[d][slot];
            meta.types[d][0] = meta.types[d][slot];
          }
          meta.sizes[0] = meta.sizes[slot];
          slot = 0;
        }
      }
    }
    ++slot;
  }
  if (meta.blocks > 0) {
    launch(meta);
    ++launches;
  }
  return launches;
}

/// The grid of one multi-tensor launch.
template <int Depth>
Grid mta_grid(const TensorListMeta<Depth>& meta) {
  return Grid{static_cast<std::uint32_t>(meta.blocks), kMtaThreads};
}

}  // namespace gpucloud::kernels
