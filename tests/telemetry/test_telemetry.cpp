// Telemetry: the /metrics endpoint over real HTTP, labels, training metrics, device metrics,
// the textfile, and every bad input a typed error.
#include <gpucloud/gpucloud.hpp>

#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace gc = gpucloud;
namespace tel = gpucloud::telemetry;

namespace {

// A TCP connection to 127.0.0.1:port, or -1.
int connect_loopback(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<std::uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// GET http://127.0.0.1:port/path with a plain socket; the body.
std::string http_get(int port, const std::string& path) {
  const int fd = connect_loopback(port);
  if (fd < 0) return "connect failed";
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
  EXPECT_TRUE(std::isnan(value_of(body, "gpucloud_straggler_rank"))) << "exported without straggler detection";
  EXPECT_NE(body.find("# TYPE gpucloud_memory_pool_allocations_total counter"), std::string::npos) << body;
  EXPECT_EQ(value_of(body, "gpucloud_memory_pool_allocations_total"), 7);
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
                 {"DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_SM_CLOCK",
                  // health (what DCGM's exporter serves on every data-center GPU)
                  "DCGM_FI_DEV_XID_ERRORS", "DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS",
                  "DCGM_FI_DEV_POWER_MGMT_LIMIT", "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"});
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

namespace {

// A connection to 127.0.0.1:port that sent @p bytes and then nothing (a slow or idle client).
int half_sent_request(int port, const std::string& bytes) {
  const int fd = connect_loopback(port);
  if (fd >= 0) (void)::write(fd, bytes.data(), bytes.size());
  return fd;
}

// True while the server keeps @p fd open (nothing to read, no end of stream), without waiting.
bool still_open(int fd) {
  char c = 0;
  const ssize_t n = ::recv(fd, &c, 1, MSG_DONTWAIT | MSG_PEEK);
  return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
}

// Waits (up to @p limit, polling) until the server closed @p fd.
bool closed_by_server(int fd, std::chrono::seconds limit) {
  const auto end = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < end) {
    if (!still_open(fd)) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

}  // namespace

// Slow clients: while idle half-sent requests hold connections, a scrape is served at once (the
// idle ones are still open when it returns: it did not wait for their timeout), and the idle ones
// are dropped after the request timeout.
TEST(TelemetryEndpoint, SlowClientsDoNotStarveTheScraper) {
  tel::ExporterOptions o;
  o.address = "127.0.0.1";
  o.threads = 4;
  o.request_timeout = std::chrono::seconds(120);  // the idle clients outlive any scrape below
  tel::Exporter exporter(o);
  exporter.steps().record({0.5, 10, 0, 0, 0, 0});
  std::vector<int> idle;
  for (int i = 0; i < 3; ++i) idle.push_back(half_sent_request(exporter.port(), "GET /metrics HTTP/1.1\r\nHost: x"));
  for (int fd : idle) ASSERT_GE(fd, 0);
  for (int i = 0; i < 3; ++i) {
    const std::string body = http_get(exporter.port(), "/metrics");
    EXPECT_EQ(value_of(body, "gpucloud_steps_total"), 1) << body;
  }
  for (int fd : idle) EXPECT_TRUE(still_open(fd)) << "the scrape waited for an idle client's timeout";
  for (int fd : idle) ::close(fd);
}

TEST(TelemetryEndpoint, AnIdleClientIsDisconnectedAfterTheRequestTimeout) {
  tel::ExporterOptions o;
  o.address = "127.0.0.1";
  o.threads = 1;  // one thread: the idle client holds it until its timeout
  o.request_timeout = std::chrono::milliseconds(300);
  tel::Exporter exporter(o);
  const int idle = half_sent_request(exporter.port(), "GET /met");
  ASSERT_GE(idle, 0);
  EXPECT_TRUE(closed_by_server(idle, std::chrono::seconds(60)));
  ::close(idle);
  EXPECT_NE(http_get(exporter.port(), "/metrics").find("gpucloud_steps_total"), std::string::npos);
}

TEST(TelemetryEndpoint, ReservedAndInvalidLabelNamesAreRefused) {
  tel::ExporterOptions o;
  o.port = -1;
  for (const char* reserved : {"le", "quantile", "gpu", "device", "modelName", "UUID"}) {
    o.labels = {{reserved, "x"}};
    try {
      tel::Exporter e(o);
      ADD_FAILURE() << "label '" << reserved << "' accepted";
    } catch (const gc::InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("reserved"), std::string::npos) << e.what();
    }
  }
}

TEST(TelemetryEndpoint, AddressesAndServerOptionsAreValidated) {
  tel::ExporterOptions o;
  for (const char* bad : {"999.1.1.1", "1.2.3", "localhost", "", "127.0.0.1:80", "0.0.0.0 "}) {
    o.address = bad;
    try {
      tel::Exporter e(o);
      ADD_FAILURE() << "address '" << bad << "' accepted";
    } catch (const gc::InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("options.address"), std::string::npos) << e.what();
    }
  }
  o.address = "127.0.0.1";
  o.threads = 0;
  EXPECT_THROW(tel::Exporter{o}, gc::InvalidArgument);
  o.threads = 2;
  o.request_timeout = std::chrono::milliseconds(0);
  EXPECT_THROW(tel::Exporter{o}, gc::InvalidArgument);
  o.request_timeout = std::chrono::seconds(1);
  o.tls_cert_file = "/etc/hostname";  // without its key
  EXPECT_THROW(tel::Exporter{o}, gc::InvalidArgument);
  o.tls_key_file = "/etc/hostname";  // both, but no PEM in them
  EXPECT_THROW(tel::Exporter{o}, gc::InvalidArgument);
  o.tls_cert_file = o.tls_key_file = "";
  o.basic_auth_users = {{"prom", "plain-text-password"}};
  EXPECT_THROW(tel::Exporter{o}, gc::InvalidArgument);
  o.basic_auth_users = {{"a:b", "$2y$10$abcdefghijklmnopqrstuu5Mb8ZQwZrtvYQFvbdmK1cR3iHbE/7Xm"}};
  EXPECT_THROW(tel::Exporter{o}, gc::InvalidArgument);
  o.basic_auth_users = {};
  for (const char* bad : {"10.0.0.0/33", "10.0.0/8", "any", "10.0.0.0/"}) {
    o.allow = {bad};
    EXPECT_THROW(tel::Exporter{o}, gc::InvalidArgument) << bad;
  }
}

TEST(TelemetryEndpoint, AnAllowListRefusesOtherClients) {
  tel::ExporterOptions o;
  o.address = "127.0.0.1";
  o.allow = {"10.0.0.0/8"};  // not this machine's loopback
  tel::Exporter refused(o);
  EXPECT_EQ(http_get(refused.port(), "/metrics").find("gpucloud_steps_total"), std::string::npos);
  o.allow = {"10.0.0.0/8", "127.0.0.0/8"};
  tel::Exporter allowed(o);
  EXPECT_NE(http_get(allowed.port(), "/metrics").find("gpucloud_steps_total"), std::string::npos);
}

TEST(TelemetryMetrics, NeverRecordedSeriesAreAbsentAndUnitsAreBase) {
  tel::ExporterOptions o;
  o.port = -1;
  tel::Exporter exporter(o);
  std::string text = exporter.exposition();
  for (const char* series :
       {"gpucloud_loss_scale", "gpucloud_samples_per_second", "gpucloud_memory_pool_bytes_in_use",
        "gpucloud_memory_pool_allocations_total", "gpucloud_straggler", "gpucloud_checkpoint_pending_saves",
        "gpucloud_checkpoint_last_commit_timestamp_seconds"}) {
    EXPECT_TRUE(std::isnan(value_of(text, series))) << series << " exported before it was recorded:\n" << text;
  }
  EXPECT_EQ(value_of(text, "gpucloud_steps_total"), 0);  // counters start at 0, as Prometheus advises
  gc::MetricsMonitor monitor(gc::Device::host(), std::chrono::milliseconds(20));
  exporter.watch(monitor);
  text = exporter.exposition();
  EXPECT_EQ(text.find("_percent"), std::string::npos) << text;
  EXPECT_EQ(text.find("_mhz"), std::string::npos) << text;
  const double ratio = value_of(text, "gpucloud_host_utilization_ratio");
  if (!std::isnan(ratio)) {
    EXPECT_TRUE(ratio >= 0 && ratio <= 1) << ratio;
  }
  const double hertz = value_of(text, "gpucloud_host_clock_hertz");
  if (!std::isnan(hertz)) {
    EXPECT_GT(hertz, 1e7);
  }
  exporter.unwatch(monitor);
  // Counters fed from running totals only go up.
  gc::MemoryStatistics mem;
  mem.total_allocations = 5;
  exporter.steps().record_memory(mem);
  mem.total_allocations = 9;
  exporter.steps().record_memory(mem);
  EXPECT_EQ(value_of(exporter.exposition(), "gpucloud_memory_pool_allocations_total"), 9);
}

TEST(TelemetryMetrics, CheckpointProgressIsExported) {
  tel::ExporterOptions o;
  o.port = -1;
  tel::Exporter exporter(o);
  gc::checkpoint::Progress p;
  p.writing_step = 12;
  p.committed_step = 10;
  p.committed_unix_time = 1.8e9;
  p.waited_seconds = 2.5;
  p.saves_failed = 1;
  exporter.steps().record_checkpoint_progress(p);
  p.writing_step.reset();
  p.waited_seconds = 4;
  exporter.steps().record_checkpoint_progress(p);
  const std::string text = exporter.exposition();
  EXPECT_EQ(value_of(text, "gpucloud_checkpoint_pending_saves"), 0);
  EXPECT_EQ(value_of(text, "gpucloud_checkpoint_committed_step"), 10);
  EXPECT_EQ(value_of(text, "gpucloud_checkpoint_last_commit_timestamp_seconds"), 1.8e9);
  EXPECT_EQ(value_of(text, "gpucloud_checkpoint_wait_seconds_total"), 4);
  EXPECT_EQ(value_of(text, "gpucloud_checkpoint_failures_total"), 1);
  p.waited_seconds = -1;
  EXPECT_THROW(exporter.steps().record_checkpoint_progress(p), gc::InvalidArgument);
}
