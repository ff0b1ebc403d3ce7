// Test support: run a suite on every device the machine has; CUDA cases skip with the reason.
#pragma once

#include <gpucloud/runtime/device.hpp>

#include <gtest/gtest.h>

#include <ostream>
#include <string>
#include <vector>

namespace gpucloud::testing {

/// One device a parametrised test runs on.
struct DeviceCase {
  std::string name;
  bool cuda;
};

/// Prints the case by name in test listings.
inline void PrintTo(const DeviceCase& c, std::ostream* os) { *os << c.name; }

inline std::vector<DeviceCase> device_cases() { return {{"host", false}, {"cuda0", true}}; }

inline std::string device_case_name(const ::testing::TestParamInfo<DeviceCase>& info) { return info.param.name; }

/// Fixture base: device() is the case's device; a CUDA case skips, with the reason, without a GPU.
class OnEveryDevice : public ::testing::TestWithParam<DeviceCase> {
 protected:
  void SetUp() override {
    if (GetParam().cuda) {
      if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device: " << cuda_unavailable_reason();
      device_ = Device::cuda(0);
    }
  }
  Device device() const { return device_; }

 private:
  Device device_ = Device::host();
};

}  // namespace gpucloud::testing

#define GPUCLOUD_INSTANTIATE_ON_EVERY_DEVICE(Suite)                                                  \
  INSTANTIATE_TEST_SUITE_P(Devices, Suite, ::testing::ValuesIn(::gpucloud::testing::device_cases()), \
                           ::gpucloud::testing::device_case_name)
