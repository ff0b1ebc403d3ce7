// Checkpoints across processes, driven by CTest:
//   checkpoint_tool save DIR STEP   every rank of the job (mpirun -np N) saves the same state
//   checkpoint_tool load DIR STEP   every rank (any number) loads it and checks every value
//   checkpoint_tool full-disk DIR   DIR is a small tmpfs: a save that does not fit fails at
//                                   wait() with the I/O error, and the previous one stays latest
#include <gpucloud/gpucloud.hpp>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace gc = gpucloud;
namespace ck = gpucloud::checkpoint;

namespace {

struct Tensor {
  std::string name;
  gc::DType dtype;
  std::vector<std::int64_t> shape;
};

// The state a data-parallel job replicates on every rank: sizes that do not split evenly.
std::vector<Tensor> layout() {
  return {{"model.embed", gc::DType::bfloat16, {300, 17}}, {"model.w1", gc::DType::float32, {128, 64}},
          {"model.b1", gc::DType::float32, {64}},          {"model.w2", gc::DType::float16, {64, 9}},
          {"optimizer.step", gc::DType::int64, {1}},       {"scaler.tracker", gc::DType::int32, {1}},
          {"model.empty", gc::DType::float32, {0}},        {"codes", gc::DType::uint8, {1001}}};
}

std::size_t count(const std::vector<std::int64_t>& shape) {
  std::size_t n = 1;
  for (auto d : shape) n *= static_cast<std::size_t>(d);
  return n;
}

// Byte i of tensor @p t at step @p step.
unsigned char byte_of(const std::string& name, std::size_t i, std::int64_t step) {
  std::size_t h = std::hash<std::string>()(name) ^ static_cast<std::size_t>(step) * 0x9e3779b97f4a7c15ull;
  return static_cast<unsigned char>((h >> (i % 7)) + i * 31);
}

std::vector<gc::Buffer> make_state(std::int64_t step, gc::StateDict& state) {
  std::vector<gc::Buffer> buffers;
  for (const auto& t : layout()) {
    buffers.emplace_back(count(t.shape), t.dtype, gc::Device::host(), gc::MemoryKind::pinned);
    auto* p = static_cast<unsigned char*>(buffers.back().data());
    for (std::size_t i = 0; i < buffers.back().size_bytes(); ++i) p[i] = byte_of(t.name, i, step);
    state[t.name] = {buffers.back().view(), t.shape};
  }
  return buffers;
}

int save(const std::string& dir, std::int64_t step) {
  const gc::LaunchInfo launch = gc::launch_info_from_environment();
  std::optional<gc::Communicator> comm;
  if (launch.size > 1) comm.emplace(gc::Communicator::mpi_world());
  gc::Stream s;
  gc::StateDict state;
  auto buffers = make_state(step, state);
  ck::Options o;
  o.comm = comm ? &*comm : nullptr;
  o.commit_timeout = std::chrono::seconds(60);
  ck::Checkpointer writer(dir, o);
  writer.save_async(step, state, s, {{"written.by", std::to_string(launch.size)}}).wait();
  const ck::Manifest m = ck::read_manifest(dir + "/" + ck::directory_name(step));
  std::printf("rank %d: saved step %lld, %d file(s)\n", launch.rank, static_cast<long long>(step),
              static_cast<int>(m.files.size()));
  return m.world_size == launch.size ? 0 : 1;
}

int load(const std::string& dir, std::int64_t step) {
  const gc::LaunchInfo launch = gc::launch_info_from_environment();
  std::optional<gc::Communicator> comm;
  if (launch.size > 1) comm.emplace(gc::Communicator::mpi_world());  // a job of M ranks, as a real resume
  gc::Stream s;
  gc::StateDict into;
  std::vector<gc::Buffer> buffers;
  for (const auto& t : layout()) {
    buffers.emplace_back(count(t.shape), t.dtype, gc::Device::host(), gc::MemoryKind::device);
    if (!buffers.back().view().empty()) std::memset(buffers.back().data(), 0, buffers.back().size_bytes());
    into[t.name] = {buffers.back().view(), t.shape};
  }
  const auto latest = ck::latest(dir);
  if (!latest) {
    std::printf("rank %d: no checkpoint in %s\n", launch.rank, dir.c_str());
    return 1;
  }
  const ck::Manifest m = ck::load(*latest, into, s);
  int bad = 0;
  std::size_t k = 0;
  for (const auto& t : layout()) {
    const auto* p = static_cast<const unsigned char*>(buffers[k++].data());
    for (std::size_t i = 0; i < count(t.shape) * gc::dtype_size(t.dtype); ++i) bad += p[i] != byte_of(t.name, i, step);
  }
  std::printf("rank %d of %d: loaded step %lld written by %d rank(s) (%s), %d wrong bytes\n", launch.rank, launch.size,
              static_cast<long long>(m.step), m.world_size, m.metadata.at("written.by").c_str(), bad);
  return bad == 0 && m.step == step ? 0 : 1;
}

int full_disk(const std::string& dir) {
  gc::Stream s;
  gc::Buffer small(1000, gc::DType::float32, gc::Device::host(), gc::MemoryKind::pinned);
  gc::fill(small, 1.0, s);
  ck::Checkpointer writer(dir);
  writer.save(1, {{"w", {small, {}}}}, s);
  gc::Buffer big(1 << 20, gc::DType::float32, gc::Device::host(), gc::MemoryKind::pinned);  // 4 MiB: beyond the tmpfs
  gc::fill(big, 2.0, s);
  ck::PendingSave pending = writer.save_async(2, {{"w", {big, {}}}}, s);
  try {
    pending.wait();
    std::printf("FAILED: the save that cannot fit reported success\n");
    return 1;
  } catch (const gc::CheckpointError& e) {
    std::printf("wait() raised: %s\n", e.what());
    if (std::strstr(e.what(), "No space left") == nullptr) return 1;
  }
  pending.wait();  // raised once
  const auto latest = ck::latest(dir);
  if (!latest || *latest != dir + "/" + ck::directory_name(1)) {
    std::printf("FAILED: latest is %s\n", latest ? latest->c_str() : "none");
    return 1;
  }
  gc::Buffer back(1000, gc::DType::float32, gc::Device::host(), gc::MemoryKind::pinned);
  ck::load(*latest, {{"w", {back, {}}}}, s);
  if (back.data_as<float>()[999] != 1.0f) return 1;
  // The space of the failed save was given back: a save that fits succeeds again.
  writer.save(3, {{"w", {small, {}}}}, s);
  std::printf("FULL DISK TEST PASSED: latest %s\n", ck::latest(dir)->c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) try {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "save" && argc == 4) return save(argv[2], std::stoll(argv[3]));
  if (mode == "load" && argc == 4) return load(argv[2], std::stoll(argv[3]));
  if (mode == "full-disk" && argc == 3) return full_disk(argv[2]);
  std::fprintf(stderr, "usage: checkpoint_tool save|load DIR STEP | full-disk DIR\n");
  return 2;
} catch (const std::exception& e) {
  std::fprintf(stderr, "checkpoint_tool: %s\n", e.what());
  return 1;
}
