// Test support for the collectives suites (one MPI program, test_collectives, built from
// test_collectives*.cpp, test_grad_buckets.cpp and collectives_main.cpp): the world communicator,
// and inputs whose every exact answer is known on every rank whatever the reduction order
// (nccl-tests' verifiable inputs).
#pragma once

#include <gpucloud/comm/communicator.hpp>
#include <gpucloud/comm/grad_buckets.hpp>
#include <gpucloud/comm/mpi_interop.hpp>
#include <gpucloud/memory/buffer.hpp>
#include <gpucloud/movement/copy.hpp>
#include <gpucloud/runtime/build_info.hpp>
#include <gpucloud/runtime/error.hpp>
#include <gpucloud/runtime/stream.hpp>

#include <gtest/gtest.h>
#include <mpi.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <future>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace gpucloud::testing::collectives {

namespace gc = gpucloud;

inline gc::Communicator& world() {
  static gc::Communicator c = gc::Communicator::mpi_world();
  return c;
}

// Rank r's element i: small integers, exact in every dtype and in any order of summation.
inline double value(int r, std::size_t i) { return static_cast<double>((r + 1) * static_cast<int>(1 + i % 7)); }

template <class F>
void for_each_dtype(F f) {
  for (auto t : {gc::DType::float32, gc::DType::float64, gc::DType::float16, gc::DType::bfloat16, gc::DType::int32,
                 gc::DType::int64}) {
    f(t);
  }
}

inline void store(gc::Buffer& b, std::size_t i, double v) {
  switch (b.dtype()) {
    case gc::DType::float32:
      b.data_as<float>()[i] = static_cast<float>(v);
      break;
    case gc::DType::float64:
      b.data_as<double>()[i] = v;
      break;
    case gc::DType::float16:
      b.data_as<gc::Half>()[i] = gc::Half(static_cast<float>(v));
      break;
    case gc::DType::bfloat16:
      b.data_as<gc::BFloat16>()[i] = gc::BFloat16(static_cast<float>(v));
      break;
    case gc::DType::int32:
      b.data_as<std::int32_t>()[i] = static_cast<std::int32_t>(v);
      break;
    default:
      b.data_as<std::int64_t>()[i] = static_cast<std::int64_t>(v);
      break;
  }
}

inline double load(const gc::Buffer& b, std::size_t i) {
  switch (b.dtype()) {
    case gc::DType::float32:
      return b.data_as<float>()[i];
    case gc::DType::float64:
      return b.data_as<double>()[i];
    case gc::DType::float16:
      return static_cast<float>(b.data_as<gc::Half>()[i]);
    case gc::DType::bfloat16:
      return static_cast<float>(b.data_as<gc::BFloat16>()[i]);
    case gc::DType::int32:
      return b.data_as<std::int32_t>()[i];
    default:
      return static_cast<double>(b.data_as<std::int64_t>()[i]);
  }
}

// Whether every rank of MPI_COMM_WORLD holds the same bytes in @p b (a checksum's min and max over
// the ranks), for results whose rounding depends on the order of a reduction.
inline bool same_bytes_on_every_rank(const gc::Buffer& b) {
  std::uint64_t sum = 0;
  const auto* bytes = static_cast<const unsigned char*>(b.data());
  for (std::size_t i = 0; i < b.size_bytes(); ++i) sum = sum * 1099511628211ull + bytes[i];
  std::uint64_t low = sum, high = sum;
  MPI_Allreduce(MPI_IN_PLACE, &low, 1, MPI_UINT64_T, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(MPI_IN_PLACE, &high, 1, MPI_UINT64_T, MPI_MAX, MPI_COMM_WORLD);
  return low == high;
}

inline double expected(gc::ReduceOp op, int size, std::size_t i) {
  double acc = op == gc::ReduceOp::min ? 1e300 : op == gc::ReduceOp::max ? -1e300 : 0;
  for (int r = 0; r < size; ++r) {
    const double v = value(r, i);
    acc = op == gc::ReduceOp::max ? std::max(acc, v) : op == gc::ReduceOp::min ? std::min(acc, v) : acc + v;
  }
  return op == gc::ReduceOp::average ? acc / size : acc;
}

inline gc::Buffer inputs(gc::DType t, std::size_t n, int rank) {
  gc::Buffer b(n, t);
  for (std::size_t i = 0; i < n; ++i) store(b, i, value(rank, i));
  return b;
}

inline constexpr std::size_t kCounts[] = {0, 1, 5, 1001, (1u << 16) + 3};

// Queues a short sleep on @p s: the collectives enqueued next run on its worker, not in place.
inline void keep_busy(gc::Stream& s) {
  gc::launch_host_func(s, [] { std::this_thread::sleep_for(std::chrono::microseconds(200)); });
}

// The collective just enqueued on @p s had mismatched arguments across ranks: synchronize() raises
// a CommunicationError that says they disagree and contains @p also (on one rank, nothing to raise).
inline void expect_disagreement(gc::Stream& s, gc::Communicator& c, const std::string& also) {
  try {
    s.synchronize();
    if (c.size() > 1) ADD_FAILURE() << "mismatched collectives must be an error";
  } catch (const gc::CommunicationError& e) {
    EXPECT_NE(std::string(e.what()).find("disagree"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(also), std::string::npos) << e.what();
  }
}

}  // namespace gpucloud::testing::collectives
