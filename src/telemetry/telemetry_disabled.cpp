// Built without prometheus-cpp: an Exporter cannot be made, so nothing else can be reached.
#include <gpucloud/runtime/error.hpp>
#include <gpucloud/telemetry/telemetry.hpp>

namespace gpucloud::telemetry {

struct Exporter::Impl {};
struct StepMetrics::Impl {};

Exporter::Exporter(ExporterOptions) {
  GPUCLOUD_FAIL(Unsupported, "Exporter",
                "gpucloud was built without prometheus-cpp (Debian: prometheus-cpp-dev; scripts/setup.sh installs it)");
}
Exporter::~Exporter() = default;
Exporter::Exporter(Exporter&&) noexcept = default;
Exporter& Exporter::operator=(Exporter&&) noexcept = default;
int Exporter::port() const { return -1; }
void Exporter::watch(const MetricsMonitor&) {}
void Exporter::unwatch(const MetricsMonitor&) {}
StepMetrics& Exporter::steps() { GPUCLOUD_FAIL(Unsupported, "Exporter::steps", "built without prometheus-cpp"); }
void Exporter::detect_stragglers(Communicator&, StreamView, StragglerOptions) {}
StragglerReport Exporter::straggler_report() const { return {}; }
std::string Exporter::exposition() const { return {}; }
void Exporter::write_textfile() const {}
void StepMetrics::record(const StepRecord&) {}
void StepMetrics::record_checkpoint(double) {}
void StepMetrics::record_memory(const MemoryStatistics&) {}
void StepMetrics::record_checkpoint_progress(const checkpoint::Progress&) {}
std::int64_t StepMetrics::steps() const { return 0; }

}  // namespace gpucloud::telemetry
