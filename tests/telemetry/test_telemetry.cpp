// Telemetry: the /metrics endpoint over real HTTP, labels, training metrics, device metrics,
// the textfile, and every bad input a typed error.
#include <gpucloud/gpucloud.hpp>

#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

namespace gc = gpucloud;
namespace tel = gpucloud::telemetry;

namespace {

// GET http://127.0.0.1:port/path with a plain socket; the body.
std::string http_get(int port, const std::string& path) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<std::uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    ::close(fd);
    return "connect failed";
  }
  const std::string request = "GET " + path + " HTTP/1.0\r\nHost: localhost\r\n\r\n";
  (void)::write(fd, request.data(), request.size());
  std::string response;
  char buf[4096];
  for (ssize_t n; (n = ::read(fd, buf, sizeof buf)) > 0;) response.append(buf, static_cast<std::size_t>(n));
  ::close(fd);
  const auto body = response.find("\r\n\r\n");
  return body == std::string::npos ? response : response.substr(body + 4);
}

// The value of the first sample line starting with @p series (name and labels), or NaN.
double value_of(const std::string& text, const std::string& series) {
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (line.compare(0, series.size(), series) == 0 && line.size() > series.size() &&
        (line[series.size()] == ' ' || line[series.size()] == '{')) {
      return std::stod(line.substr(line.rfind(' ') + 1));
    }
  }
  return std::nan("");
}

TEST(Telemetry, ServesRecordedStepsOverHttpWithTheJobLabels) {
  tel::ExporterOptions o;
  o.address = "127.0.0.1";
  o.labels = tel::job_labels(gc::LaunchInfo{3, 8, 1, 4, "mpirun"});
  tel::Exporter exporter(o);
  ASSERT_GT(exporter.port(), 0);  // port 0 picked one
  auto& steps = exporter.steps();
  for (int i = 0; i < 4; ++i) {
    tel::StepRecord r;
    r.seconds = 0.02 * (i + 1);
    r.samples = 64;
    r.data_wait_seconds = 0.005;
    r.comm_seconds = 0.001;
    r.loss_scale = 32768;
    r.skipped = i == 2 ? 1 : 0;
    steps.record(r);
  }
  steps.record_checkpoint(0.75);
  gc::MemoryStatistics mem;
  mem.current_bytes = 1000;
  mem.peak_bytes = 4000;
  mem.total_allocations = 7;
  steps.record_memory(mem);
  EXPECT_EQ(steps.steps(), 4);
  const std::string body = http_get(exporter.port(), "/metrics");
  EXPECT_NE(body.find("# TYPE gpucloud_step_seconds histogram"), std::string::npos) << body;
  EXPECT_NE(body.find("rank=\"3\""), std::string::npos) << body;
  EXPECT_NE(body.find("local_rank=\"1\""), std::string::npos) << body;
  EXPECT_NE(body.find("job=\""), std::string::npos) << body;
  EXPECT_EQ(value_of(body, "gpucloud_steps_total"), 4);
  EXPECT_EQ(value_of(body, "gpucloud_samples_total"), 256);
  EXPECT_EQ(value_of(body, "gpucloud_skipped_steps_total"), 1);
  EXPECT_NEAR(value_of(body, "gpucloud_data_wait_seconds_total"), 0.02, 1e-12);
  EXPECT_NEAR(value_of(body, "gpucloud_comm_seconds_total"), 0.004, 1e-12);
  EXPECT_EQ(value_of(body, "gpucloud_loss_scale"), 32768);
  EXPECT_EQ(value_of(body, "gpucloud_step_seconds_count"), 4);
  EXPECT_NEAR(value_of(body, "gpucloud_step_seconds_sum"), 0.2, 1e-12);
  EXPECT_EQ(value_of(body, "gpucloud_checkpoint_save_seconds_count"), 1);
  EXPECT_EQ(value_of(body, "gpucloud_memory_pool_peak_bytes"), 4000);
  EXPECT_NEAR(value_of(body, "gpucloud_samples_per_second"), 64 / 0.08, 1e-9);
  EXPECT_EQ(value_of(body, "gpucloud_straggler_rank"), -1);
  EXPECT_NE(body.find(exporter.exposition()), std::string::npos);  // plus the exposer's own exposer_* series
}

TEST(Telemetry, HostDeviceMetricsAtEachScrape) {
  tel::ExporterOptions o;
  o.port = -1;
  o.labels = {{"job", "t"}};
  tel::Exporter exporter(o);
  EXPECT_EQ(exporter.port(), -1);
  gc::MetricsMonitor monitor(gc::Device::host(), std::chrono::milliseconds(20));
  exporter.watch(monitor);
  std::string text = exporter.exposition();
  EXPECT_GT(value_of(text, "gpucloud_host_memory_used_bytes"), 0) << text;
  EXPECT_NE(text.find("device=\"host\""), std::string::npos);
  EXPECT_NE(text.find("job=\"t\""), std::string::npos);
  exporter.unwatch(monitor);
  text = exporter.exposition();
  EXPECT_EQ(text.find("gpucloud_host_memory_used_bytes"), std::string::npos);
}

// On a GPU the device metrics are the DCGM exporter's series (names, units, gpu/UUID/modelName
// labels), so its dashboards and alert rules apply unchanged; scripts/gpu-check.sh runs this.
TEST(Telemetry, GpuMetricsCarryTheDcgmExportersNamesAndLabels) {
  if (gc::cuda_device_count() == 0) GTEST_SKIP() << "no GPU: " << gc::cuda_unavailable_reason();
  tel::ExporterOptions o;
  o.port = -1;
  o.labels = {{"job", "t"}};
  tel::Exporter exporter(o);
  gc::MetricsMonitor monitor(gc::Device::cuda(0), std::chrono::milliseconds(20));
  exporter.watch(monitor);
  const std::string text = exporter.exposition();
  std::vector<std::string> names = {"DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE"};
  if (gc::nvml_unavailable_reason().empty()) {  // the rest come from NVML
    names.insert(names.end(),
                 {"DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_SM_CLOCK"});
  }
  for (const auto& name : names) {
    EXPECT_NE(text.find("# TYPE " + name + " gauge"), std::string::npos) << name << "\n" << text;
  }
  EXPECT_NE(text.find("gpu=\"0\""), std::string::npos) << text;
  EXPECT_NE(text.find("modelName=\""), std::string::npos) << text;
  EXPECT_NE(text.find("job=\"t\""), std::string::npos) << text;
  const gc::MemoryInfo mem = gc::memory_info(gc::Device::cuda(0));
  const double total_mib = static_cast<double>(mem.total) / (1024.0 * 1024.0);
  EXPECT_NEAR(value_of(text, "DCGM_FI_DEV_FB_USED") + value_of(text, "DCGM_FI_DEV_FB_FREE"), total_mib,
              0.01 * total_mib)
      << text;
  if (gc::nvml_unavailable_reason().empty()) {
    EXPECT_GT(value_of(text, "DCGM_FI_DEV_GPU_TEMP"), 0) << text;
    EXPECT_GT(value_of(text, "DCGM_FI_DEV_SM_CLOCK"), 0) << text;
  }
  exporter.unwatch(monitor);
}

TEST(Telemetry, TextfileIsWrittenWhole) {
  const std::string path =
      (std::filesystem::temp_directory_path() / ("gpucloud_tm_" + std::to_string(::getpid()) + ".prom")).string();
  tel::ExporterOptions o;
  o.port = -1;
  o.textfile = path;
  tel::Exporter exporter(o);
  exporter.steps().record({0.5, 10, 0, 0, 0, 0});
  exporter.write_textfile();
  std::ifstream f(path);
  std::stringstream text;
  text << f.rdbuf();
  EXPECT_EQ(text.str(), exporter.exposition());
  std::filesystem::remove(path);
  tel::ExporterOptions none;
  none.port = -1;
  EXPECT_THROW(tel::Exporter(none).write_textfile(), gc::InvalidArgument);
  o.textfile = "/nonexistent-dir/x.prom";
  EXPECT_THROW(tel::Exporter(o).write_textfile(), gc::Error);
}

TEST(Telemetry, BadInputIsATypedError) {
  tel::ExporterOptions o;
  o.port = -1;
  for (const char* bad : {"1rank", "has-dash", "__reserved", ""}) {
    o.labels = {{bad, "x"}};
    try {
      tel::Exporter e(o);
      ADD_FAILURE() << "label name '" << bad << "' accepted";
    } catch (const gc::InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("labels"), std::string::npos) << e.what();
    }
  }
  o.labels = {{"job", "\xff\xfe"}};
  EXPECT_THROW(tel::Exporter{o}, gc::InvalidArgument);
  o.labels = {};
  o.port = 70000;
  EXPECT_THROW(tel::Exporter{o}, gc::InvalidArgument);
  // A port in use.
  tel::ExporterOptions first;
  first.address = "127.0.0.1";
  tel::Exporter a(first);
  tel::ExporterOptions second = first;
  second.port = a.port();
  try {
    tel::Exporter b(second);
    ADD_FAILURE() << "a port in use was accepted";
  } catch (const gc::InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find(std::to_string(a.port())), std::string::npos) << e.what();
  }
  // Figures that are not finite and non-negative; nothing recorded.
  const double nan = std::numeric_limits<double>::quiet_NaN();
  EXPECT_THROW(a.steps().record({nan, 1, 0, 0, 0, 0}), gc::InvalidArgument);
  EXPECT_THROW(a.steps().record({-1, 1, 0, 0, 0, 0}), gc::InvalidArgument);
  EXPECT_THROW(a.steps().record({1, -1, 0, 0, 0, 0}), gc::InvalidArgument);
  EXPECT_THROW(a.steps().record({1, 1, 0, INFINITY, 0, 0}), gc::InvalidArgument);
  EXPECT_THROW(a.steps().record_checkpoint(-2), gc::InvalidArgument);
  EXPECT_EQ(a.steps().steps(), 0);
}

}  // namespace
