// The NCCL backend in one process: argument checks that need no GPU, and on a GPU a one-rank
// communicator (both constructors) through every operation and dtype, comm_group, and the errors
// for memory and streams it cannot use. Multi-rank NCCL runs in test_collectives under mpirun when
// there are as many GPUs as ranks.
#include <gpucloud/comm/communicator.hpp>
#include <gpucloud/comm/grad_buckets.hpp>
#include <gpucloud/compute/cast.hpp>
#include <gpucloud/memory/buffer.hpp>
#include <gpucloud/movement/copy.hpp>
#include <gpucloud/runtime/build_info.hpp>
#include <gpucloud/runtime/error.hpp>
#include <gpucloud/runtime/stream.hpp>

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

namespace gc = gpucloud;

namespace {

bool nccl_built() { return gc::build_info().nccl; }

}  // namespace

TEST(Nccl, BadArgumentsAreTypedErrorsBeforeAnyGpuWork) {
  const gc::NcclUniqueId id{};
  if (!nccl_built()) {
    EXPECT_THROW(gc::Communicator::nccl(id, 0, 1, gc::Device::host()), gc::Unsupported);
    EXPECT_THROW(gc::Communicator::nccl_unique_id(), gc::Unsupported);
    EXPECT_THROW(gc::Communicator::nccl_single_process({}), gc::Unsupported);
    int calls = 0;
    gc::comm_group([&] { ++calls; });  // a plain call without NCCL
    EXPECT_EQ(calls, 1);
    return;
  }
  EXPECT_THROW(gc::Communicator::nccl(id, 0, 1, gc::Device::host()), gc::InvalidArgument);
  EXPECT_THROW(gc::Communicator::nccl(id, 2, 2, gc::Device::host()), gc::InvalidArgument);
  EXPECT_THROW(gc::Communicator::nccl(id, -1, 2, gc::Device::host()), gc::InvalidArgument);
  EXPECT_THROW(gc::Communicator::nccl_single_process({}), gc::InvalidArgument);
  EXPECT_THROW(gc::Communicator::nccl_single_process({gc::Device::host()}), gc::InvalidArgument);
  try {
    gc::Communicator::nccl(id, 0, 1, gc::Device::host());
  } catch (const gc::InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("device: NCCL communicators live on a GPU"), std::string::npos) << e.what();
  }
}

class NcclOnOneGpu : public ::testing::TestWithParam<bool> {  // true: nccl(id, 0, 1); false: single-process
 protected:
  void SetUp() override {
    if (gc::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device: " << gc::cuda_unavailable_reason();
    if (!nccl_built()) GTEST_SKIP() << "built without NCCL (GPUCLOUD_NCCL=OFF or none found)";
  }
  gc::Communicator make() {
    if (GetParam()) return gc::Communicator::nccl(gc::Communicator::nccl_unique_id(), 0, 1, gc::Device::cuda(0));
    auto all = gc::Communicator::nccl_single_process({gc::Device::cuda(0)});
    return std::move(all.front());
  }
};

TEST_P(NcclOnOneGpu, EveryOperationAndDtypeOnOneRank) {
  gc::Communicator c = make();
  EXPECT_EQ(c.backend(), gc::CommBackend::nccl);
  EXPECT_EQ(c.device(), gc::Device::cuda(0));
  EXPECT_EQ(c.rank(), 0);
  EXPECT_EQ(c.size(), 1);
  gc::Stream s(gc::Device::cuda(0));
  for (auto t : {gc::DType::float32, gc::DType::float64, gc::DType::int32, gc::DType::int64}) {
    const std::size_t n = 1001;
    gc::Buffer host(n, t, gc::Device::host(), gc::MemoryKind::pinned),
        back(n, t, gc::Device::host(), gc::MemoryKind::pinned);
    for (std::size_t i = 0; i < n; ++i) {
      if (t == gc::DType::float32) host.data_as<float>()[i] = static_cast<float>(i);
      if (t == gc::DType::float64) host.data_as<double>()[i] = static_cast<double>(i);
      if (t == gc::DType::int32) host.data_as<std::int32_t>()[i] = static_cast<std::int32_t>(i);
      if (t == gc::DType::int64) host.data_as<std::int64_t>()[i] = static_cast<std::int64_t>(i);
    }
    gc::Buffer a(n, t, gc::Device::cuda(0)), b(n, t, gc::Device::cuda(0));
    gc::copy(a, host, s);
    c.all_reduce(a, b, gc::ReduceOp::sum, s);               // one rank: b = a
    c.hierarchical_all_reduce(b, b, gc::ReduceOp::max, s);  // in place
    c.broadcast(b, 0, s);
    c.reduce_scatter(b, a, gc::ReduceOp::min, s);
    c.all_gather(a, b, s);
    c.barrier(s);
    gc::copy(back, b, s);
    s.synchronize();
    EXPECT_EQ(std::memcmp(back.data(), host.data(), n * gc::dtype_size(t)), 0) << gc::dtype_name(t);
  }
  // comm_group: the collectives are issued as one NCCL group, then tracked.
  gc::Buffer x(8, gc::DType::float32, gc::Device::cuda(0));
  gc::comm_group([&] {
    c.all_reduce(x, x, gc::ReduceOp::sum, s);
    c.all_reduce(x, x, gc::ReduceOp::average, s);
  });
  s.synchronize();
  EXPECT_FALSE(c.broken());
}

TEST_P(NcclOnOneGpu, GradientBucketsRunOverNcclOnDeviceGradients) {
  gc::Communicator c = make();
  gc::Stream s(gc::Device::cuda(0));
  std::vector<gc::Buffer> grads;
  std::vector<gc::BufferView> views;
  gc::BucketOptions options;
  options.first_bucket_bytes = 1024;
  options.bucket_bytes = 16384;
  options.wire_dtype = gc::DType::bfloat16;
  for (std::size_t n : {10u, 5000u, 300u, 70000u}) {
    grads.emplace_back(n, gc::DType::float32, gc::Device::cuda(0));
    gc::fill(grads.back(), 1.5, s);  // exact in bfloat16: compression changes nothing
    views.push_back(grads.back());
  }
  gc::GradBucketer buckets(c, views, options);
  EXPECT_GT(buckets.bucket_count(), 1u);
  for (std::size_t i = views.size(); i-- > 0;) buckets.mark_ready(i, s);
  buckets.wait(s);
  std::size_t wrong = 0;
  for (auto& g : grads) {
    gc::Buffer host(g.size(), gc::DType::float32, gc::Device::host(), gc::MemoryKind::pinned);
    gc::copy(host, g, s);
    s.synchronize();
    for (std::size_t i = 0; i < g.size(); ++i) wrong += host.data_as<float>()[i] != 1.5f;  // the average of one rank
  }
  EXPECT_EQ(wrong, 0u);
}

TEST_P(NcclOnOneGpu, MemoryAndStreamsItCannotUseAreRejected) {
  gc::Communicator c = make();
  gc::Stream gpu(gc::Device::cuda(0)), host_stream;
  gc::Buffer device(4, gc::DType::float32, gc::Device::cuda(0));
  std::vector<float> pageable(4);
  gc::BufferView pageable_view(pageable.data(), 4, gc::DType::float32, gc::MemoryKind::host, gc::Device::host());
  EXPECT_THROW(c.all_reduce(pageable_view, pageable_view, gc::ReduceOp::sum, gpu), gc::InvalidArgument);
  EXPECT_THROW(c.all_reduce(device, device, gc::ReduceOp::sum, host_stream), gc::InvalidArgument);
  gc::Buffer ints(4, gc::DType::int32, gc::Device::cuda(0));
  EXPECT_THROW(c.all_reduce(ints, ints, gc::ReduceOp::average, gpu), gc::InvalidArgument);
  EXPECT_THROW(c.all_reduce(device, ints, gc::ReduceOp::sum, gpu), gc::InvalidArgument);
  EXPECT_THROW(c.broadcast(device, 1, gpu), gc::InvalidArgument);
  EXPECT_FALSE(c.broken());  // rejected calls break nothing
  c.all_reduce(device, device, gc::ReduceOp::sum, gpu);
  gpu.synchronize();
}

std::string constructor_name(const ::testing::TestParamInfo<bool>& p) { return p.param ? "InitRank" : "SingleProcess"; }

INSTANTIATE_TEST_SUITE_P(Constructors, NcclOnOneGpu, ::testing::Values(true, false), constructor_name);

// A rank that never joins: the non-blocking init waits GPUCLOUD_COMM_TIMEOUT, then aborts and
// raises CommunicationError naming the timeout (a blocking init would wait for ever). The
// communicator is then dropped without a hang, and a new one works.
TEST(NcclTimeout, AnInitWhoseOtherRankNeverComesFailsAtTheTimeout) {
  if (gc::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device: " << gc::cuda_unavailable_reason();
  if (!nccl_built()) GTEST_SKIP() << "built without NCCL (GPUCLOUD_NCCL=OFF or none found)";
  ASSERT_EQ(setenv("GPUCLOUD_COMM_TIMEOUT", "2", 1), 0);  // this case runs in its own process (CTest)
  const auto t0 = std::chrono::steady_clock::now();
  try {
    gc::Communicator::nccl(gc::Communicator::nccl_unique_id(), 0, 2, gc::Device::cuda(0));
    ADD_FAILURE() << "a two-rank init with one rank returned";
  } catch (const gc::CommunicationError& e) {
    EXPECT_NE(std::string(e.what()).find("GPUCLOUD_COMM_TIMEOUT"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("ncclCommInitRankConfig"), std::string::npos) << e.what();
  }
  const auto took = std::chrono::steady_clock::now() - t0;
  EXPECT_GE(took, std::chrono::seconds(2));
  EXPECT_LT(took, std::chrono::seconds(120));  // bounded: a hang would be the CTest timeout
  gc::Communicator ok = gc::Communicator::nccl(gc::Communicator::nccl_unique_id(), 0, 1, gc::Device::cuda(0));
  gc::Stream s(gc::Device::cuda(0));
  gc::Buffer x(4, gc::DType::float32, gc::Device::cuda(0));
  ok.all_reduce(x, x, gc::ReduceOp::sum, s);
  s.synchronize();
}
