// The all-reduce cost model's predictions, flat vs hierarchical, for 8 to 1024 GPUs (8 per node)
// on A100 and H100 clusters: NVLink inside a node, InfiniBand between nodes (one NIC per GPU).
// Link figures from GPU_SPECS.md: ring busbw inside a DGX A100 ~230 GB/s, DGX H100 ~370 GB/s;
// 46-48 GB/s per 400 Gb/s NIC (23 GB/s per 200 Gb/s); latencies as NCCL typically shows them.
// Under mpirun it also measures this job's model and prints predictions against measured times.
#include <gpucloud/gpucloud.hpp>

#include <chrono>
#include <cstdio>
#include <cstring>

namespace gc = gpucloud;

namespace {

struct Cluster {
  const char* name;
  gc::LinkCost nvlink, ib;
};

void predictions() {
  const Cluster clusters[] = {
      {"A100 + 200 Gb/s IB", {5e-6, 1.0 / 230e9}, {10e-6, 1.0 / 23e9}},
      {"A100 + 400 Gb/s IB", {5e-6, 1.0 / 230e9}, {10e-6, 1.0 / 47e9}},
      {"H100 + 400 Gb/s IB", {4e-6, 1.0 / 370e9}, {8e-6, 1.0 / 47e9}},
  };
  for (std::size_t bytes : {std::size_t{25} << 20, std::size_t{1} << 30}) {
    std::printf("\n### all-reduce of %s, predicted time (ms): flat / hierarchical\n\n",
                bytes == (std::size_t{1} << 30) ? "1 GiB" : "25 MiB (a DDP bucket)");
    std::printf("| GPUs |");
    for (const auto& c : clusters) std::printf(" %s |", c.name);
    std::printf("\n|---|");
    for (std::size_t i = 0; i < sizeof clusters / sizeof clusters[0]; ++i) std::printf("---|");
    std::printf("\n");
    for (int gpus = 8; gpus <= 1024; gpus *= 2) {
      std::printf("| %d |", gpus);
      for (const auto& c : clusters) {
        gc::AllReduceCostModel m{c.nvlink, c.ib, 8, gpus / 8};
        const double f = m.flat_seconds(bytes) * 1e3, h = m.hierarchical_seconds(bytes) * 1e3;
        std::printf(" %.2f / %.2f%s |", f, h, h < f ? " (h)" : "");
      }
      std::printf("\n");
    }
  }
}

void measured_against_predicted() {
  gc::Communicator c = gc::Communicator::mpi_world();
  gc::Stream s;
  const gc::AllReduceCostModel m = c.measure_cost_model(s);
  if (c.rank() == 0) {
    std::printf("\n### this job: %d node(s) of %d, measured model %s\n\n", c.nodes(), c.local_size(),
                m.to_json().c_str());
    std::printf(
        "| bytes | flat predicted | flat measured | hierarchical predicted | hierarchical measured "
        "|\n|---|---|---|---|---|\n");
  }
  for (std::size_t bytes : {std::size_t{1} << 10, std::size_t{1} << 16, std::size_t{1} << 20, std::size_t{8} << 20}) {
    gc::Buffer buf(bytes / 4, gc::DType::float32);
    std::memset(buf.data(), 0, bytes);
    auto time = [&](bool hierarchical) {
      double best = 1e30;
      for (int rep = 0; rep < 5; ++rep) {
        c.barrier(s);
        s.synchronize();
        const auto t0 = std::chrono::steady_clock::now();
        if (hierarchical) {
          c.hierarchical_all_reduce(buf, buf, gc::ReduceOp::sum, s);
        } else {
          c.all_reduce(buf, buf, gc::ReduceOp::sum, s);
        }
        s.synchronize();
        best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      }
      return best;
    };
    const double flat = time(false), hier = time(true);
    if (c.rank() == 0) {
      std::printf("| %zu | %.1f us | %.1f us | %.1f us | %.1f us |\n", bytes, m.flat_seconds(bytes) * 1e6, flat * 1e6,
                  m.hierarchical_seconds(bytes) * 1e6, hier * 1e6);
    }
  }
}

}  // namespace

int main() {
  const gc::LaunchInfo info = gc::launch_info_from_environment();
  if (info.rank == 0) predictions();
  if (info.size > 1) measured_against_predicted();
  return 0;
}
