#include <gpucloud/comm/communicator.hpp>
#include <gpucloud/runtime/build_info.hpp>
#include <gpucloud/runtime/device.hpp>
#include <gpucloud/runtime/error.hpp>
#include <gpucloud/runtime/threads.hpp>

#include <gtest/gtest.h>

#include "device_cases.hpp"

#include <sched.h>

#include <cstdlib>
#include <string>
#include <thread>

namespace gc = gpucloud;

TEST(Device, HostAlwaysExistsAndComesFirst) {
  const auto devices = gc::available_devices();
  ASSERT_FALSE(devices.empty());
  EXPECT_TRUE(devices.front().is_host());
  EXPECT_EQ(devices.size(), static_cast<std::size_t>(1 + gc::cuda_device_count()));
  EXPECT_EQ(gc::Device::host().str(), "host");
  EXPECT_EQ(gc::Device::parse("cpu"), gc::Device::host());
}

TEST(Device, AbsentCudaIsAClearErrorNeverACrash) {
  if (gc::cuda_device_count() > 0) {
    EXPECT_TRUE(gc::cuda_unavailable_reason().empty());
    const int n = gc::cuda_device_count();
    try {
      (void)gc::Device::cuda(n);
      FAIL() << "cuda:" << n << " should be out of range";
    } catch (const gc::InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("index"), std::string::npos) << e.what();
    }
    return;
  }
  const std::string reason = gc::cuda_unavailable_reason();
  EXPECT_FALSE(reason.empty());
  try {
    (void)gc::Device::cuda(0);
    FAIL() << "Device::cuda(0) must throw without a GPU";
  } catch (const gc::Unsupported& e) {
    EXPECT_FALSE(gc::build_info().cuda);
    EXPECT_NE(std::string(e.what()).find("without CUDA"), std::string::npos) << e.what();
  } catch (const gc::DeviceError& e) {
    EXPECT_TRUE(gc::build_info().cuda);
    EXPECT_FALSE(e.sticky());
    // The driver's own reason ("driver insufficient" on a machine without a GPU) is passed on.
    EXPECT_NE(std::string(e.what()).find(reason), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("cuda:0"), std::string::npos) << e.what();
  }
  EXPECT_THROW((void)gc::Device::parse("cuda:0"), gc::Error);
}

TEST(Device, ParseRejectsGarbage) {
  for (const char* text : {"gpu", "cuda:", "cuda:x", "cuda:1x", "", "GPU-", "MIG"}) {
    EXPECT_THROW((void)gc::Device::parse(text), gc::InvalidArgument) << text;
  }
}

TEST(Device, ParseFindsAVisibleDeviceByItsUuid) {
  // Every visible GPU by its own UUID; an unknown one (a MIG instance not made visible) is named.
  for (int i = 0; i < gc::cuda_device_count(); ++i) {
    const std::string uuid = gc::device_properties(gc::Device::cuda(i)).uuid;
    EXPECT_EQ(gc::Device::parse(uuid), gc::Device::cuda(i)) << uuid;
  }
  try {
    (void)gc::Device::parse("MIG-0badc0de-0000-0000-0000-000000000000");
    FAIL() << "an unknown UUID was accepted";
  } catch (const gc::InvalidArgument& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("'MIG-0badc0de-0000-0000-0000-000000000000' is not the UUID of any of the"), std::string::npos)
        << what;
    EXPECT_NE(what.find("nvidia-smi -L lists them"), std::string::npos) << what;
  }
}

TEST(HostThreads, TheBudgetIsTheAffinityMaskCappedByTheCgroupQuota) {
  // Under taskset and in real cgroup CPU quotas: python/tests/test_threads.py (fresh processes).
  const gpucloud::HostThreads t = gpucloud::host_threads();
  cpu_set_t mask;
  CPU_ZERO(&mask);
  ASSERT_EQ(sched_getaffinity(0, sizeof(mask), &mask), 0);
  EXPECT_GE(t.cpus, 1);
  EXPECT_LE(t.cpus, CPU_COUNT(&mask));
  EXPECT_EQ(t.reason.rfind("affinity " + std::to_string(CPU_COUNT(&mask)) + " of " +
                               std::to_string(std::thread::hardware_concurrency()) + " cores",
                           0),
            0u)
      << t.reason;
  if (t.reason.find("cgroup quota") == std::string::npos) {
    EXPECT_EQ(t.cpus, CPU_COUNT(&mask)) << t.reason;
  }
  if (std::getenv(gpucloud::kHostThreadsEnv) == nullptr) {
    EXPECT_EQ(t.pool, t.cpus);
  }
  const bool blas = std::string(gpucloud::build_info().host_blas) == "OpenBLAS";
  if (!blas) {
    EXPECT_EQ(t.blas, 0);
  }
  if (blas && std::getenv("OPENBLAS_NUM_THREADS") == nullptr && std::getenv("OMP_NUM_THREADS") == nullptr &&
      std::getenv("GOTO_NUM_THREADS") == nullptr) {
    EXPECT_EQ(t.blas, t.pool);
  }
}

TEST(BuildInfo, DescribesTheBuild) {
  const auto info = gc::build_info();
  EXPECT_FALSE(info.version.empty());
  EXPECT_EQ(info.cuda, info.cuda_runtime_version > 0);
  EXPECT_EQ(info.cuda, !info.cuda_architectures.empty());
  if (!info.cuda) {
    EXPECT_FALSE(info.nccl);
    EXPECT_FALSE(info.cudnn);
  }
  EXPECT_TRUE(info.host_blas == "OpenBLAS" || info.host_blas == "built-in") << info.host_blas;
  EXPECT_TRUE(info.host_bf16_gemm == "oneDNN" || info.host_bf16_gemm == "widened to fp32") << info.host_bf16_gemm;
  EXPECT_TRUE(info.host_conv == "oneDNN" || info.host_conv == "im2col + GEMM") << info.host_conv;
  if (!info.nccl) {  // the NCCL entry points say so, typed
    EXPECT_THROW((void)gc::Communicator::nccl_unique_id(), gc::Unsupported);
  }
}

class DeviceProps : public gc::testing::OnEveryDevice {};

TEST_P(DeviceProps, PropertiesAndMemoryInfoAreSane) {
  const auto p = gc::device_properties(device());
  EXPECT_FALSE(p.name.empty());
  EXPECT_GT(p.total_memory, 0u);
  EXPECT_GT(p.multiprocessor_count, 0);
  EXPECT_EQ(p.backend, device().is_host() ? "host" : "cuda");
  if (device().is_cuda()) {
    EXPECT_GE(p.compute_capability_major, 7);
  }
  const auto m = gc::memory_info(device());
  EXPECT_GT(m.total, 0u);
  EXPECT_LE(m.free, m.total);
  EXPECT_EQ(gc::Device::parse(device().str()), device());
}

GPUCLOUD_INSTANTIATE_ON_EVERY_DEVICE(DeviceProps);
