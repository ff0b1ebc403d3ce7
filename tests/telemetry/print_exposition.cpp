// Prints what a scrape of an Exporter returns after one recorded step of every kind, with the
// host's device metrics: the metric names the dashboard check compares against.
#include <gpucloud/gpucloud.hpp>

#include <cstdio>

int main() {
  namespace tel = gpucloud::telemetry;
  tel::ExporterOptions o;
  o.port = -1;
  o.labels = {{"job", "print"}};
  tel::Exporter exporter(o);
  gpucloud::MetricsMonitor monitor(gpucloud::Device::host());
  exporter.watch(monitor);
  exporter.steps().record({0.01, 8, 0.001, 0.001, 1024, 0});
  exporter.steps().record_checkpoint(0.5);
  exporter.steps().record_memory({});
  gpucloud::checkpoint::Progress progress;
  progress.committed_step = 100;
  progress.committed_unix_time = 1.7e9;
  exporter.steps().record_checkpoint_progress(progress);
  std::fputs(exporter.exposition().c_str(), stdout);
  return 0;
}
