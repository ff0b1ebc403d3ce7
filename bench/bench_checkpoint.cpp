// Checkpoint save throughput against the plain way to write the same bytes durably, interleaved
// round by round on the same disk (nccl-tests style: report what was measured, no adjustments).
//
//   bench_checkpoint [--mib 1024] [--rounds 5] [--tensors 16] [--ranks-files 1] [--dir DIR]
//
// Per round, in alternating order:
//   gpucloud  Checkpointer::save of the state (snapshot into pinned staging, XXH3 of every
//             tensor, one safetensors file, manifest, fsync of files and directories, rename)
//   raw       the same number of bytes from one contiguous buffer: open, one write(), fsync,
//             close, rename of the directory, fsync of the parent (the same durability)
// and the time save_async() takes to return (what the training loop pays).
// Prints each round and the median ratio raw_time / gpucloud_time (1.0: as fast as raw writes).
#include <gpucloud/gpucloud.hpp>

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

namespace gc = gpucloud;
namespace ck = gpucloud::checkpoint;
using Clock = std::chrono::steady_clock;

namespace {

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

void check(bool ok, const char* what) {
  if (!ok) {
    std::perror(what);
    std::exit(1);
  }
}

// The plain durable write of @p n bytes as DIR/file, DIR then renamed into place.
void raw_write(const std::string& root, int round, const void* data, std::size_t n) {
  const std::string tmp = root + "/raw.tmp", final_dir = root + "/raw-" + std::to_string(round);
  std::filesystem::create_directories(tmp);
  const int fd = ::open((tmp + "/data.bin").c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  check(fd >= 0, "open");
  const char* p = static_cast<const char*>(data);
  for (std::size_t left = n; left > 0;) {
    const ssize_t w = ::write(fd, p, left);
    check(w > 0, "write");
    p += w;
    left -= static_cast<std::size_t>(w);
  }
  check(::fsync(fd) == 0, "fsync");
  check(::close(fd) == 0, "close");
  check(::rename(tmp.c_str(), final_dir.c_str()) == 0, "rename");
  const int dfd = ::open(root.c_str(), O_RDONLY | O_DIRECTORY);
  check(dfd >= 0 && ::fsync(dfd) == 0, "fsync dir");
  ::close(dfd);
}

}  // namespace

int main(int argc, char** argv) {
  std::size_t mib = 1024;
  int rounds = 5, tensors = 16;
  std::string dir = "bench_checkpoint.tmp";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i], v = argv[i + 1];
    if (a == "--mib")
      mib = std::stoul(v);
    else if (a == "--rounds")
      rounds = std::stoi(v);
    else if (a == "--tensors")
      tensors = std::stoi(v);
    else if (a == "--dir")
      dir = v;
    else {
      std::fprintf(stderr, "usage: bench_checkpoint [--mib N] [--rounds N] [--tensors N] [--dir DIR]\n");
      return 2;
    }
  }
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  gc::Stream s;
  // The state: --tensors fp32 tensors of unequal sizes (the largest 2x the smallest), --mib in all.
  const std::size_t total_floats = mib * (1u << 20) / 4;
  std::vector<gc::Buffer> buffers;
  gc::StateDict state;
  std::size_t sum_weights = 0;
  for (int t = 0; t < tensors; ++t) sum_weights += static_cast<std::size_t>(tensors + t);
  std::size_t bytes = 0;
  for (int t = 0; t < tensors; ++t) {
    const std::size_t n = total_floats / sum_weights * static_cast<std::size_t>(tensors + t);
    buffers.emplace_back(n, gc::DType::float32, gc::Device::host(), gc::MemoryKind::device);
    gc::fill(buffers.back(), 0.001 * t, s);
    state["layer" + std::to_string(t) + ".weight"] = {buffers.back().view(), {}};
    bytes += n * 4;
  }
  gc::Buffer contiguous(bytes, gc::DType::uint8, gc::Device::host(), gc::MemoryKind::pinned);
  std::memset(contiguous.data(), 1, bytes);
  s.synchronize();
  std::printf("bench_checkpoint: %.1f MiB in %d fp32 tensors, %d rounds, directory %s\n",
              static_cast<double>(bytes) / (1 << 20), tensors, rounds, std::filesystem::absolute(dir).c_str());
  std::printf("%5s %12s %12s %12s %10s %14s\n", "round", "gpucloud s", "raw s", "gpucloud GB/s", "ratio",
              "async return ms");
  // keep_last 0 and the old checkpoints deleted between rounds, untimed: the raw side deletes
  // nothing either (with keep_last, the deletion is part of a commit, in the background when async).
  ck::Checkpointer writer(dir + "/ckpt");
  std::vector<double> ratios;
  for (int r = 0; r < rounds; ++r) {
    double g = 0, raw = 0;
    for (int order = 0; order < 2; ++order) {
      if ((order == 0) == (r % 2 == 0)) {
        const auto t = Clock::now();
        writer.save(r, state, s);
        g = seconds_since(t);
      } else {
        const auto t = Clock::now();
        raw_write(dir, r, contiguous.data(), bytes);
        raw = seconds_since(t);
        std::filesystem::remove_all(dir + "/raw-" + std::to_string(r));
      }
    }
    const auto t = Clock::now();
    ck::PendingSave p = writer.save_async(1000 + r, state, s);
    const double async_ms = seconds_since(t) * 1e3;
    p.wait();
    std::filesystem::remove_all(dir + "/ckpt");
    ratios.push_back(raw / g);
    std::printf("%5d %12.3f %12.3f %12.2f %10.3f %14.2f\n", r, g, raw, static_cast<double>(bytes) / g / 1e9, raw / g,
                async_ms);
  }
  std::sort(ratios.begin(), ratios.end());
  std::printf("median save throughput vs one write() per file: %.3f (target >= 0.8)\n", ratios[ratios.size() / 2]);
  std::filesystem::remove_all(dir);
  return 0;
}
