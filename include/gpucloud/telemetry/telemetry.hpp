/// @file telemetry.hpp
/// @brief Prometheus metrics of a training process: a /metrics endpoint (prometheus-cpp), device
///        metrics under the DCGM exporter's names, and per-step training metrics.
#pragma once

#include <gpucloud/checkpoint/checkpoint.hpp>
#include <gpucloud/comm/communicator.hpp>
#include <gpucloud/export.hpp>
#include <gpucloud/memory/resource_adaptors.hpp>
#include <gpucloud/monitor/monitor.hpp>

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace gpucloud::telemetry {

/// @brief Label names and values (Prometheus rules: names [a-zA-Z_][a-zA-Z0-9_]*, not "__"-prefixed,
///        not one the exporter sets itself: le, quantile, gpu, device, modelName, UUID; values UTF-8).
using Labels = std::map<std::string, std::string>;

/// @brief How a process exports its metrics.
struct ExporterOptions {
  /// HTTP port serving /metrics: 0 picks a free one (see Exporter::port()), -1 serves none (the
  /// textfile only).
  int port = 0;
  /// The address to bind: an IPv4 address ("0.0.0.0": every interface, the exporters'
  /// convention; "127.0.0.1": this machine only) or an IPv6 one ("::1").
  std::string address = "0.0.0.0";
  /// Threads serving HTTP: each open connection holds one while its request is read, so this
  /// many slow or idle clients at once are needed to delay a scrape (by request_timeout at most).
  int threads = 8;
  /// How long a client may take to send its request before it is disconnected.
  std::chrono::milliseconds request_timeout = std::chrono::seconds(5);
  /// TLS (Prometheus web-config's tls_server_config.cert_file): the PEM certificate (chain);
  /// with tls_key_file serves HTTPS only, without both plain HTTP.
  std::string tls_cert_file;
  /// TLS: the PEM private key of tls_cert_file (web-config's tls_server_config.key_file).
  std::string tls_key_file;
  /// Basic authentication (web-config's basic_auth_users): user -> bcrypt hash ("$2y$..."); empty
  /// serves without. Use it with TLS: basic auth sends the password in clear otherwise.
  std::map<std::string, std::string> basic_auth_users;
  /// Clients allowed to connect, as IPv4 CIDR blocks ("10.0.0.0/8", "127.0.0.1"); empty allows all.
  std::vector<std::string> allow;
  /// Put on every series this process exports (rank, local_rank, node, job: job_labels()).
  Labels labels;
  /// If set, write_textfile() writes the exposition there atomically (node_exporter's textfile
  /// collector reads *.prom files from a directory).
  std::string textfile;
};

/// @brief rank, local_rank, node (the host name) and job (SLURM_JOB_ID, else GPUCLOUD_JOB, else
///        "local") of this process, from @p launch.
GPUCLOUD_API Labels job_labels(const LaunchInfo& launch);

/// @brief One training step, as StepMetrics::record takes it.
struct StepRecord {
  double seconds = 0;            ///< wall time of the step
  std::int64_t samples = 0;      ///< samples (this rank's) processed in it
  double data_wait_seconds = 0;  ///< of which waiting for input (the prefetcher)
  double comm_seconds = 0;       ///< time the step's collectives took (Communicator::busy_seconds deltas)
  double loss_scale = 0;         ///< the loss scale after the step (0: not reported)
  std::int64_t skipped = 0;      ///< steps the optimizer skipped (overflows) since the last record: 0 or 1
                                 ///< per step, or what a log step found
};

/// @brief The training metrics of one process (gpucloud_step_seconds, gpucloud_samples_total, ...;
///        docs/telemetry.md lists them). Thread-safe; a record costs well under a microsecond.
class GPUCLOUD_API StepMetrics {
 public:
  /// @brief Adds one step. @throws InvalidArgument for negative or non-finite figures.
  void record(const StepRecord& step);
  /// @brief Adds one checkpoint save of @p seconds (gpucloud_checkpoint_save_seconds).
  void record_checkpoint(double seconds);
  /// @brief Sets the memory pool gauges (and the allocations counter) from a StatisticsAdaptor's
  ///        figures.
  void record_memory(const MemoryStatistics& statistics);
  /// @brief Sets the checkpoint writer's gauges from Checkpointer::progress()
  ///        (gpucloud_checkpoint_pending_saves, _last_commit_timestamp_seconds, ...).
  void record_checkpoint_progress(const checkpoint::Progress& progress);
  /// @brief Steps recorded so far.
  std::int64_t steps() const;

  struct Impl;  ///< internal
  /// @brief Internal: made by an Exporter.
  explicit StepMetrics(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}

 private:
  std::shared_ptr<Impl> impl_;
};

/// @brief Straggler detection's settings.
struct StragglerOptions {
  int every = 50;          ///< steps per period: each rank sends rank 0 its means at every period's end
  double threshold = 0.2;  ///< a rank is a straggler when its mean own work per step is this much above the median
  double min_excess_seconds = 0.005;  ///< ...and at least this many seconds above it (below it, a shared
                                      ///< host's scheduling noise at millisecond steps); 0: none
};

/// @brief What the last exchange found.
struct StragglerReport {
  std::vector<double> step_seconds;     ///< every rank's mean step time over the last period, by rank
  std::vector<double> compute_seconds;  ///< every rank's mean own work per step (the step less its data
                                        ///< wait and collectives), by rank: what the detection compares
  std::vector<std::int64_t> steps;      ///< the steps each rank had recorded at its last period's end
  std::vector<int> lost;                ///< ranks whose channel closed (ended or died); their last
                                        ///< period is still compared
  double median = 0;                    ///< the median of compute_seconds
  int slowest = -1;                     ///< the rank of the most own work per step
  bool straggler = false;               ///< the slowest is beyond the threshold and the minimum excess
};

/// @brief A process's metrics endpoint: a Prometheus registry served at /metrics (prometheus-cpp's
///        exposer, its own threads), its device metrics read from a MetricsMonitor at each scrape,
///        and its training metrics. One per process; every rank of a job serves its own.
class GPUCLOUD_API Exporter {
 public:
  /// @brief Starts serving.
  /// @throws InvalidArgument for a bad label (naming it), a port out of range or one that cannot
  ///         be bound (in use), an address that is not one, bad TLS files, a basic-auth hash that
  ///         is not bcrypt, an allow entry that is not a CIDR block; Unsupported when built without
  ///         prometheus-cpp.
  explicit Exporter(ExporterOptions options = {});
  ~Exporter();                               ///< Stops serving.
  Exporter(Exporter&&) noexcept;             ///< Moves ownership.
  Exporter& operator=(Exporter&&) noexcept;  ///< Moves ownership.
  Exporter(const Exporter&) = delete;
  Exporter& operator=(const Exporter&) = delete;

  /// @brief The port serving /metrics (the one picked for port 0), or -1 when none.
  int port() const;
  /// @brief Exports @p monitor's latest reading at each scrape: DCGM_FI_DEV_* for a GPU (labels gpu,
  ///        UUID, modelName), gpucloud_host_* for the host. @p monitor must outlive the exporter or
  ///        be unwatched.
  void watch(const MetricsMonitor& monitor);
  /// @brief Stops exporting @p monitor.
  void unwatch(const MetricsMonitor& monitor);
  /// @brief The training metrics.
  StepMetrics& steps();
  /// @brief Compares the ranks' own work per step (the step less its data wait and collectives):
  ///        each rank sends rank 0 its means every options.every recorded steps over a TCP channel
  ///        of its own, rank 0 sends every rank the latest of all; record() never waits for it and
  ///        ranks may record different numbers of steps, stop or die (then listed as lost). Exports
  ///        gpucloud_rank_step_seconds{rank=...}, gpucloud_rank_compute_seconds{rank=...},
  ///        gpucloud_straggler(_rank) and gpucloud_straggler_ranks_lost. A collective over @p comm
  ///        (a broadcast and an all-reduce on @p stream, then never again): every rank calls it.
  /// @throws InvalidArgument for bad options or a stream of another device; CommunicationError on
  ///         every rank when some rank could not reach rank 0 (naming it and the addresses tried).
  void detect_stragglers(Communicator& comm, StreamView stream, StragglerOptions options = {});
  /// @brief The report of the last completed exchange (empty before the first).
  StragglerReport straggler_report() const;
  /// @brief The exposition a scrape returns now (Prometheus text format 0.0.4).
  std::string exposition() const;
  /// @brief Writes exposition() to options.textfile atomically (a temporary file, then rename).
  /// @throws InvalidArgument without a textfile, Error (naming the path) on an I/O failure.
  void write_textfile() const;

  struct Impl;  ///< internal

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace gpucloud::telemetry
