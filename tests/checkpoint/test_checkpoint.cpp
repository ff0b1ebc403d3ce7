// Checkpoints: round trips of every dtype, the safetensors layout, atomic commits and keep_last,
// every kind of damage and mismatch (a typed error, the caller's memory untouched), and the
// optimizers' and the scaler's state_dict.
#include <gpucloud/gpucloud.hpp>

#include "device_cases.hpp"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

namespace gc = gpucloud;
namespace ck = gpucloud::checkpoint;
namespace fs = std::filesystem;

namespace {

// A fresh directory per test.
std::string fresh_dir(const std::string& name) {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  std::string id = std::string(info->test_suite_name()) + "_" + info->name() + "_" + name;
  for (auto& c : id) {
    if (c == '/') c = '_';
  }
  const fs::path p = fs::temp_directory_path() / ("gpucloud_ck_" + std::to_string(::getpid())) / id;
  fs::remove_all(p);
  fs::create_directories(p);
  return p.string();
}

// Bytes of host-visible or device memory.
std::vector<unsigned char> bytes_of(gc::BufferView v, gc::StreamView s) {
  gc::Buffer host(v.size_bytes(), gc::DType::uint8, gc::Device::host(), gc::MemoryKind::pinned);
  if (v.size_bytes() > 0) {
    gc::copy(host, gc::BufferView(v.data(), v.size_bytes(), gc::DType::uint8, v.kind(), v.device()), s);
  }
  s.synchronize();
  const auto* p = static_cast<const unsigned char*>(host.data());
  return std::vector<unsigned char>(p, p + v.size_bytes());
}

// A buffer of @p n elements of @p t on @p d whose bytes are a function of @p seed.
gc::Buffer pattern(std::size_t n, gc::DType t, gc::Device d, gc::StreamView s, unsigned seed) {
  gc::Buffer host(n, t, gc::Device::host(), gc::MemoryKind::pinned);
  std::mt19937 rng(seed);
  auto* p = static_cast<unsigned char*>(host.data());
  for (std::size_t i = 0; i < host.size_bytes(); ++i) p[i] = static_cast<unsigned char>(rng());
  // Keep floats finite: clear the top exponent bit of each element's high byte.
  gc::Buffer out(n, t, d, gc::MemoryKind::device);
  if (n > 0) gc::copy(out, host, s);
  s.synchronize();
  return out;
}

void flip_byte(const std::string& path, std::uint64_t offset) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(static_cast<std::streamoff>(offset));
  char c = 0;
  f.read(&c, 1);
  c = static_cast<char>(c ^ 0x10);
  f.seekp(static_cast<std::streamoff>(offset));
  f.write(&c, 1);
}

// The safetensors layout read independently of the library: 8-byte length, JSON header, data.
std::string header_of(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  unsigned char len[8];
  f.read(reinterpret_cast<char*>(len), 8);
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = n << 8 | len[i];
  std::string h(n, '\0');
  f.read(h.data(), static_cast<std::streamsize>(n));
  return h;
}

class Checkpoint : public gc::testing::OnEveryDevice {};
GPUCLOUD_INSTANTIATE_ON_EVERY_DEVICE(Checkpoint);

TEST_P(Checkpoint, RoundTripOfEveryDtypeShapeAndEmptyTensor) {
  gc::Stream s(device());
  const std::string root = fresh_dir("root");
  std::vector<gc::Buffer> saved;
  gc::StateDict state;
  for (int i = 0; i < gc::kDTypeCount; ++i) {
    const auto t = static_cast<gc::DType>(i);
    saved.push_back(pattern(6, t, device(), s, static_cast<unsigned>(i)));
    state[std::string("t.") + gc::dtype_name(t)] = {saved.back().view(), {2, 3}};
  }
  saved.push_back(pattern(0, gc::DType::float16, device(), s, 99));
  state["empty"] = {saved.back().view(), {0, 4}};
  saved.push_back(pattern(1000, gc::DType::float32, device(), s, 7));
  state["flat"] = {saved.back().view(), {}};

  ck::Checkpointer writer(root);
  writer.save(42, state, s, {{"loader.position", "1234"}, {"note", "héllo"}});
  const auto dir = ck::latest(root);
  ASSERT_TRUE(dir.has_value());
  EXPECT_EQ(*dir, root + "/" + ck::directory_name(42));

  std::vector<gc::Buffer> loaded;
  gc::StateDict into;
  for (const auto& [name, ref] : state) {
    loaded.emplace_back(ref.view.size(), ref.view.dtype(), device(), gc::MemoryKind::device);
    into[name] = {loaded.back().view(), ref.shape};
  }
  const ck::Manifest m = ck::load(*dir, into, s);
  EXPECT_EQ(m.step, 42);
  EXPECT_EQ(m.world_size, 1);
  EXPECT_EQ(m.metadata.at("loader.position"), "1234");
  EXPECT_EQ(m.metadata.at("note"), "héllo");
  EXPECT_EQ(m.tensors.size(), state.size());
  EXPECT_EQ(m.tensors.at("empty").shape, (std::vector<std::int64_t>{0, 4}));
  EXPECT_EQ(m.tensors.at("flat").shape, (std::vector<std::int64_t>{1000}));
  for (const auto& [name, ref] : state) {
    EXPECT_EQ(bytes_of(ref.view, s), bytes_of(into[name].view, s)) << name;
  }
  // Checksums checked while copying (on a GPU: hashed from the mapping, then copied): the same bytes.
  for (auto& b : loaded) gc::fill(b, 0.0, s);
  ck::load(*dir, into, s, true, ck::Verify::while_copying);
  for (const auto& [name, ref] : state) {
    EXPECT_EQ(bytes_of(ref.view, s), bytes_of(into[name].view, s)) << name << ", verified while copying";
  }
}

TEST_P(Checkpoint, FilesAreSafetensorsWithAlignedContiguousData) {
  gc::Stream s(device());
  const std::string root = fresh_dir("root");
  gc::Buffer a = pattern(3, gc::DType::float16, device(), s, 1), b = pattern(5, gc::DType::float64, device(), s, 2);
  ck::Checkpointer(root).save(7, {{"a", {a, {}}}, {"b", {b, {}}}}, s);
  const std::string file = root + "/" + ck::directory_name(7) + "/rank-00000.safetensors";
  const std::string h = header_of(file);
  EXPECT_EQ(h.size() % 8, 0u);
  // The float64 first (widest first keeps every tensor aligned), then the float16, no holes.
  EXPECT_NE(h.find("\"b\":{\"data_offsets\":[0,40],\"dtype\":\"F64\",\"shape\":[5]}"), std::string::npos) << h;
  EXPECT_NE(h.find("\"a\":{\"data_offsets\":[40,46],\"dtype\":\"F16\",\"shape\":[3]}"), std::string::npos) << h;
  EXPECT_EQ(fs::file_size(file), 8 + h.size() + 46);
}

TEST_P(Checkpoint, AsyncSaveSnapshotsBeforeLaterWritesAndTheNextSaveWaits) {
  gc::Stream s(device());
  const std::string root = fresh_dir("root");
  gc::Buffer w(1 << 20, gc::DType::float32, device(), gc::MemoryKind::device);
  gc::fill(w, 1.0, s);
  ck::Checkpointer writer(root, {});
  ck::PendingSave first = writer.save_async(1, {{"w", {w, {}}}}, s);
  gc::fill(w, 2.0, s);  // after the snapshot in stream order: not in checkpoint 1
  ck::PendingSave second = writer.save_async(2, {{"w", {w, {}}}}, s);
  EXPECT_TRUE(first.done());  // the second save waited for the first
  second.wait();
  EXPECT_TRUE(second.done());
  EXPECT_GT(second.seconds(), 0.0);  // from save_async to the commit
  gc::Buffer out(w.size(), gc::DType::float32, device(), gc::MemoryKind::device);
  for (int step : {1, 2}) {
    ck::load(root + "/" + ck::directory_name(step), {{"w", {out, {}}}}, s);
    const auto b = bytes_of(out, s);
    float v = 0;
    std::memcpy(&v, b.data() + 4 * 12345, 4);
    EXPECT_EQ(v, static_cast<float>(step));
  }
}

TEST(CheckpointStaging, SnapshotsComeFromTheUsersResourceAndItsLimitIsTyped) {
  gc::Stream s;
  const std::string root = fresh_dir("root");
  gc::Buffer w = pattern(1000, gc::DType::float32, gc::Device::host(), s, 5);
  gc::StatisticsAdaptor stats(gc::default_resource(gc::MemoryKind::pinned, gc::Device::host()));
  ck::Options o;
  o.staging = &stats;
  {
    ck::Checkpointer writer(root, o);
    writer.save_async(1, {{"w", {w, {}}}}, s).wait();
    EXPECT_EQ(stats.statistics().current_bytes, 4000u);  // the staging copy, kept for the next save
  }
  EXPECT_EQ(stats.statistics().current_bytes, 0u);
  // A resource too small for the snapshot: OutOfMemory at save_async, nothing written.
  gc::LimitingAdaptor small(gc::default_resource(gc::MemoryKind::pinned, gc::Device::host()), 1000);
  o.staging = &small;
  ck::Checkpointer writer(fresh_dir("small"), o);
  EXPECT_THROW(writer.save_async(1, {{"w", {w, {}}}}, s), gc::OutOfMemory);
  EXPECT_FALSE(ck::latest(writer.root()).has_value());
}

TEST(CheckpointCommit, KeepLastLatestAndLeftoversOfInterruptedSaves) {
  gc::Stream s;
  const std::string root = fresh_dir("root");
  gc::Buffer w = pattern(64, gc::DType::float32, gc::Device::host(), s, 3);
  // What a killed run leaves: a temporary directory (half a file, no manifest).
  fs::create_directories(root + "/step-000000000005.tmp-0123456789abcdef");
  std::ofstream(root + "/step-000000000005.tmp-0123456789abcdef/rank-00000.safetensors") << "half";
  EXPECT_FALSE(ck::latest(root).has_value());
  ck::Options o;
  o.keep_last = 2;
  ck::Checkpointer writer(root, o);
  for (int step : {10, 20, 30}) writer.save(step, {{"w", {w, {}}}}, s);
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(root)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"step-000000000020", "step-000000000030"}));
  EXPECT_EQ(*ck::latest(root), root + "/step-000000000030");
  // The same step again replaces it.
  writer.save(30, {{"w", {w, {}}}}, s, {{"again", "yes"}});
  EXPECT_EQ(ck::read_manifest(root + "/step-000000000030").metadata.at("again"), "yes");
  EXPECT_FALSE(ck::latest(fresh_dir("empty")).has_value());
  EXPECT_FALSE(ck::latest(root + "/does-not-exist").has_value());
}

TEST(CheckpointArguments, BadCallsAreRefusedBeforeAnythingIsWritten) {
  gc::Stream s;
  const std::string root = fresh_dir("root");
  gc::Buffer w(6, gc::DType::float32);
  ck::Checkpointer writer(root);
  EXPECT_THROW(writer.save_async(-1, {{"w", {w, {}}}}, s), gc::InvalidArgument);
  EXPECT_THROW(writer.save_async(1, {{"", {w, {}}}}, s), gc::InvalidArgument);
  EXPECT_THROW(writer.save_async(1, {{"__metadata__", {w, {}}}}, s), gc::InvalidArgument);
  EXPECT_THROW(writer.save_async(1, {{"w", {w, {4, 2}}}}, s), gc::InvalidArgument);
  EXPECT_THROW(writer.save_async(1, {{"w", {w, {-2, -3}}}}, s), gc::InvalidArgument);
  EXPECT_THROW(writer.save_async(1, {{"w", {w, {}}}}, s, {{"gpucloud.run", "x"}}), gc::InvalidArgument);
  EXPECT_THROW(writer.save_async(1, {{"w", {w, {}}}}, s, {{"k", "\xff\xfe"}}), gc::InvalidArgument);
  EXPECT_TRUE(fs::is_empty(root));
  ck::Options bad;
  bad.keep_last = -1;
  EXPECT_THROW(ck::Checkpointer(root, bad), gc::InvalidArgument);
  bad.keep_last = 0;
  bad.staging = &gc::default_resource(gc::MemoryKind::device, gc::Device::host());
  try {
    ck::Checkpointer c(root, bad);
    FAIL() << "a device-memory staging resource was accepted";
  } catch (const gc::InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("options.staging"), std::string::npos) << e.what();
  }
  EXPECT_THROW(ck::Checkpointer("", {}), gc::InvalidArgument);
}

// ---- damage and mismatch --------------------------------------------------------------------

class CheckpointDamage : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fresh_dir("root");
    a_ = pattern(100, gc::DType::float32, gc::Device::host(), s_, 11);
    b_ = pattern(8, gc::DType::bfloat16, gc::Device::host(), s_, 12);
    ck::Checkpointer(root_).save(5, {{"layer.a", {a_, {10, 10}}}, {"layer.b", {b_, {}}}}, s_);
    dir_ = *ck::latest(root_);
    file_ = dir_ + "/rank-00000.safetensors";
    into_a_ = gc::Buffer(100, gc::DType::float32);
    into_b_ = gc::Buffer(8, gc::DType::bfloat16);
    std::memset(into_a_.data(), 0x5a, into_a_.size_bytes());
    std::memset(into_b_.data(), 0x5a, into_b_.size_bytes());
  }
  gc::StateDict into() const { return {{"layer.a", {into_a_, {10, 10}}}, {"layer.b", {into_b_, {}}}}; }
  // Loads @p into, checksums verified either way, expecting error E whose message names every one
  // of @p words; then checks the caller's buffers were not written (but for a checksum failure
  // found while copying, whose tensors may be written: @p untouched false).
  template <class E>
  void expect_load_fails(const gc::StateDict& target, std::vector<std::string> words, bool strict = true,
                         bool untouched_while_copying = true) {
    for (const ck::Verify verify : {ck::Verify::before_writing, ck::Verify::while_copying}) {
      SCOPED_TRACE(verify == ck::Verify::before_writing ? "verified before writing" : "verified while copying");
      try {
        ck::load(dir_, target, s_, strict, verify);
        ADD_FAILURE() << "the load succeeded";
      } catch (const E& e) {
        for (const auto& w : words) {
          EXPECT_NE(std::string(e.what()).find(w), std::string::npos) << e.what() << " / " << w;
        }
      } catch (const std::exception& e) {
        ADD_FAILURE() << "another error: " << e.what();
      }
      if (verify == ck::Verify::while_copying && !untouched_while_copying) continue;
      for (const gc::Buffer* b : {&into_a_, &into_b_}) {
        const auto* p = static_cast<const unsigned char*>(b->data());
        for (std::size_t i = 0; i < b->size_bytes(); ++i) ASSERT_EQ(p[i], 0x5a) << "written at byte " << i;
      }
    }
  }
  gc::Stream s_;
  std::string root_, dir_, file_;
  gc::Buffer a_, b_, into_a_, into_b_;
};

TEST_F(CheckpointDamage, IntactLoads) {
  ck::load(dir_, into(), s_);
  EXPECT_EQ(std::memcmp(into_a_.data(), a_.data(), a_.size_bytes()), 0);
  EXPECT_EQ(std::memcmp(into_b_.data(), b_.data(), b_.size_bytes()), 0);
  std::memset(into_a_.data(), 0x5a, into_a_.size_bytes());
  std::memset(into_b_.data(), 0x5a, into_b_.size_bytes());
  ck::load(dir_, into(), s_, true, ck::Verify::while_copying);
  EXPECT_EQ(std::memcmp(into_a_.data(), a_.data(), a_.size_bytes()), 0);
  EXPECT_EQ(std::memcmp(into_b_.data(), b_.data(), b_.size_bytes()), 0);
}

TEST_F(CheckpointDamage, AVerifyThatIsNoneOfItsValuesIsRefusedFirst) {
  fs::remove(file_);  // not reached: the argument is checked before any file is read
  try {
    ck::load(dir_, into(), s_, true, static_cast<ck::Verify>(7));
    FAIL() << "Verify(7) was accepted";
  } catch (const gc::InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("verify"), std::string::npos) << e.what();
  }
}

TEST_F(CheckpointDamage, EveryTruncationOfTheFile) {
  const auto size = fs::file_size(file_);
  std::vector<char> whole(size);
  std::ifstream(file_, std::ios::binary).read(whole.data(), static_cast<std::streamsize>(size));
  for (std::uintmax_t n :
       {std::uintmax_t{0}, std::uintmax_t{4}, std::uintmax_t{8}, std::uintmax_t{20}, size / 2, size - 1}) {
    fs::resize_file(file_, n);
    expect_load_fails<gc::CheckpointError>(into(), {"rank-00000.safetensors"});
    std::ofstream(file_, std::ios::binary).write(whole.data(), static_cast<std::streamsize>(size));
  }
  ck::load(dir_, into(), s_);  // restored: loads again
}

TEST_F(CheckpointDamage, AFlippedByteInTensorData) {
  flip_byte(file_, fs::file_size(file_) - 3);  // inside the last tensor
  expect_load_fails<gc::CheckpointError>(into(), {"checksum", "rank-00000.safetensors"}, true,
                                         /*untouched_while_copying=*/false);
}

// Many tensors, several of them MiB-sized: verified on several threads (largest first) and
// copied in pieces that bypass the caches. Every byte arrives; a damaged tensor among them is
// the one the error names, and none of the others is written.
TEST(CheckpointLoad, ManyTensorsLoadExactlyAndADamagedOneAmongThemIsNamed) {
  gc::Stream s;
  const std::string root = fresh_dir("many");
  std::vector<gc::Buffer> saved, into;
  gc::StateDict state, target;
  for (int t = 0; t < 12; ++t) {
    const std::size_t n = (t % 3 == 0 ? std::size_t{700} << 10 : std::size_t{3000}) + static_cast<std::size_t>(t) * 37;
    saved.push_back(pattern(n, gc::DType::float32, gc::Device::host(), s, 100 + static_cast<unsigned>(t)));
    into.emplace_back(n, gc::DType::float32);
  }
  for (int t = 0; t < 12; ++t) {
    const std::string name = "w" + std::to_string(t);
    state[name] = {saved[static_cast<std::size_t>(t)], {}};
    target[name] = {into[static_cast<std::size_t>(t)], {}};
  }
  ck::Checkpointer(root).save(1, state, s);
  const std::string dir = *ck::latest(root);
  ck::load(dir, target, s);
  for (int t = 0; t < 12; ++t) {
    const auto& a = saved[static_cast<std::size_t>(t)];
    ASSERT_EQ(std::memcmp(a.data(), into[static_cast<std::size_t>(t)].data(), a.size_bytes()), 0) << "w" << t;
  }
  // A byte of w6 (a large one) flipped: its name in the error, nothing of any tensor written.
  const ck::Manifest m = ck::read_manifest(dir);
  const ck::TensorInfo& w6 = m.tensors.at("w6");
  flip_byte(dir + "/" + w6.file, w6.begin + (w6.end - w6.begin) / 2);
  for (auto& b : into) std::memset(b.data(), 0x5a, b.size_bytes());
  try {
    ck::load(dir, target, s);
    FAIL() << "a damaged tensor loaded";
  } catch (const gc::CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("tensor 'w6' fails its checksum"), std::string::npos) << e.what();
  }
  for (const auto& b : into) {
    const auto* p = static_cast<const unsigned char*>(b.data());
    for (std::size_t i = 0; i < b.size_bytes(); ++i) ASSERT_EQ(p[i], 0x5a) << "written at byte " << i;
  }
  // Verified while copying: the same error; the intact tensors arrive whole (each is hashed in
  // 256 KiB pieces as it is copied: sizes of several pieces and a part, and below one).
  try {
    ck::load(dir, target, s, true, ck::Verify::while_copying);
    FAIL() << "a damaged tensor loaded while copying";
  } catch (const gc::CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("tensor 'w6' fails its checksum"), std::string::npos) << e.what();
  }
  flip_byte(dir + "/" + w6.file, w6.begin + (w6.end - w6.begin) / 2);  // and back
  for (auto& b : into) std::memset(b.data(), 0x5a, b.size_bytes());
  ck::load(dir, target, s, true, ck::Verify::while_copying);
  for (int t = 0; t < 12; ++t) {
    const auto& a = saved[static_cast<std::size_t>(t)];
    ASSERT_EQ(std::memcmp(a.data(), into[static_cast<std::size_t>(t)].data(), a.size_bytes()), 0) << "w" << t;
  }
}

TEST_F(CheckpointDamage, AFlippedByteInTheSafetensorsHeader) {
  flip_byte(file_, 12);
  expect_load_fails<gc::CheckpointError>(into(), {"rank-00000.safetensors"});
}

TEST_F(CheckpointDamage, AFlippedByteAnywhereInTheManifest) {
  const std::string manifest = dir_ + "/manifest.json";
  const auto size = fs::file_size(manifest);
  for (std::uintmax_t at = 0; at + 1 < size; at += 7) {
    flip_byte(manifest, at);
    expect_load_fails<gc::CheckpointError>(into(), {"manifest.json"});
    flip_byte(manifest, at);  // and back
  }
}

TEST_F(CheckpointDamage, AMissingFileOrManifest) {
  fs::remove(file_);
  expect_load_fails<gc::CheckpointError>(into(), {"rank-00000.safetensors"});
  fs::remove(dir_ + "/manifest.json");
  expect_load_fails<gc::CheckpointError>(into(), {"manifest.json"});
  fs::remove_all(dir_);
  expect_load_fails<gc::CheckpointError>(into(), {"no such checkpoint"});
}

TEST_F(CheckpointDamage, MismatchesNameTheTensorAndAreNotCorruption) {
  gc::Buffer wrong_dtype(100, gc::DType::float16), wrong_size(99, gc::DType::float32);
  expect_load_fails<gc::CheckpointMismatch>({{"layer.a", {wrong_dtype, {10, 10}}}, {"layer.b", {into_b_, {}}}},
                                            {"layer.a", "float32", "float16"});
  expect_load_fails<gc::CheckpointMismatch>({{"layer.a", {into_a_, {100}}}, {"layer.b", {into_b_, {}}}},
                                            {"layer.a", "[10, 10]", "[100]"});
  expect_load_fails<gc::CheckpointMismatch>({{"layer.a", {wrong_size, {}}}, {"layer.b", {into_b_, {}}}},
                                            {"layer.a", "[99]"});
  expect_load_fails<gc::CheckpointMismatch>({{"layer.a", {into_a_, {10, 10}}}}, {"layer.b", "strict"});
  expect_load_fails<gc::CheckpointMismatch>(
      {{"layer.a", {into_a_, {10, 10}}}, {"layer.b", {into_b_, {}}}, {"layer.c", {wrong_size, {}}}},
      {"layer.c", "no tensor"});
  ck::load(dir_, {{"layer.a", {into_a_, {10, 10}}}}, s_, /*strict=*/false);  // a subset, when asked
  EXPECT_EQ(std::memcmp(into_a_.data(), a_.data(), a_.size_bytes()), 0);
}

// ---- state_dict of the optimizers and the scaler -----------------------------------------

class StateDicts : public gc::testing::OnEveryDevice {};
GPUCLOUD_INSTANTIATE_ON_EVERY_DEVICE(StateDicts);

TEST_P(StateDicts, AdamResumedFromACheckpointFollowsTheSameTrajectory) {
  gc::Stream s(device());
  const std::string root = fresh_dir("root");
  auto run = [&](int steps, bool save_at_3, bool resume) {
    gc::Buffer w = pattern(0, gc::DType::float16, device(), s, 0);
    std::vector<float> init(257);
    for (std::size_t i = 0; i < init.size(); ++i) init[i] = 0.01f * static_cast<float>(i % 17) - 0.05f;
    gc::Buffer w32(init.size(), gc::DType::float32, device(), gc::MemoryKind::device);
    gc::Buffer host(init.size(), gc::DType::float32, gc::Device::host(), gc::MemoryKind::pinned);
    std::memcpy(host.data(), init.data(), init.size() * 4);
    gc::copy(w32, host, s);
    w = gc::Buffer(init.size(), gc::DType::float16, device(), gc::MemoryKind::device);
    gc::cast(w, w32, s);
    gc::Buffer g(init.size(), gc::DType::float16, device(), gc::MemoryKind::device);
    gc::AdamOptions o = gc::AdamOptions::adamw();
    o.amsgrad = true;
    gc::FusedAdam adam({{w, g}}, o, s);
    gc::LossScaler scaler(device(), s, {});
    int start = 0;
    if (resume) {
      gc::StateDict state;
      gc::merge_state(state, "optimizer.", adam.state_dict());
      gc::merge_state(state, "scaler.", scaler.state_dict());
      const ck::Manifest m = ck::load(*ck::latest(root), state, s);
      adam.load_state_dict(gc::sub_state(state, "optimizer."), s);
      scaler.load_state_dict(gc::sub_state(state, "scaler."), s);
      start = static_cast<int>(m.step);
    }
    for (int step = start; step < steps; ++step) {
      gc::fill(g, 0.001 * (step + 1), s);
      if (step == 1) gc::fill(g, std::numeric_limits<double>::infinity(), s);  // a skipped step
      scaler.unscale({g}, s);
      adam.step(s, &scaler);
      scaler.update(s);
      if (save_at_3 && step + 1 == 3) {
        gc::StateDict state;
        gc::merge_state(state, "optimizer.", adam.state_dict());
        gc::merge_state(state, "scaler.", scaler.state_dict());
        ck::Checkpointer(root).save(3, state, s);
      }
    }
    EXPECT_EQ(adam.step_count(s), static_cast<std::size_t>(steps - 1));
    return std::make_pair(bytes_of(adam.master(0), s), scaler.state(s).scale);
  };
  const auto straight = run(6, true, false);
  const auto resumed = run(6, false, true);
  EXPECT_EQ(straight.first, resumed.first);
  EXPECT_EQ(straight.second, resumed.second);
}

TEST_P(StateDicts, NamesAndBadStatesAreRefusedWithNothingChanged) {
  gc::Stream s(device());
  gc::Buffer w(10, gc::DType::bfloat16, device(), gc::MemoryKind::device),
      g(10, gc::DType::bfloat16, device(), gc::MemoryKind::device);
  gc::fill(w, 0.5, s);
  gc::SgdOptions so;
  so.momentum = 0.9f;
  gc::FusedSGD sgd({{w, g}}, so, s);
  const gc::StateDict sd = sgd.state_dict();
  std::vector<std::string> names;
  for (const auto& e : sd) names.push_back(e.first);
  EXPECT_EQ(names, (std::vector<std::string>{"state.0.master", "state.0.momentum_buffer", "step"}));
  gc::Buffer neg(1, gc::DType::int64, device(), gc::MemoryKind::device);
  gc::fill_integer(neg, -4, s);
  gc::Buffer other(10, gc::DType::float32, device(), gc::MemoryKind::device);
  gc::fill(other, 3.0, s);
  gc::StateDict bad = sd;
  bad["step"] = {neg, {}};
  bad["state.0.master"] = {other, {}};
  EXPECT_THROW(sgd.load_state_dict(bad, s), gc::InvalidArgument);
  bad = sd;
  bad.erase("state.0.momentum_buffer");
  EXPECT_THROW(sgd.load_state_dict(bad, s), gc::InvalidArgument);
  bad = sd;
  bad["extra"] = {other, {}};
  EXPECT_THROW(sgd.load_state_dict(bad, s), gc::InvalidArgument);
  bad = sd;
  gc::Buffer half(10, gc::DType::float16, device(), gc::MemoryKind::device);
  bad["state.0.master"] = {half, {}};
  EXPECT_THROW(sgd.load_state_dict(bad, s), gc::InvalidArgument);
  EXPECT_EQ(sgd.step_count(s), 0u);
  const auto master = bytes_of(sgd.master(0), s);
  float v = 0;
  std::memcpy(&v, master.data(), 4);
  EXPECT_EQ(v, 0.5f);
  // A good one from other memory: copied in, the parameter set from the master.
  bad = sd;
  bad["state.0.master"] = {other, {}};
  sgd.load_state_dict(bad, s);
  EXPECT_EQ(bytes_of(sgd.master(0), s), bytes_of(other, s));

  gc::LossScaler scaler(device(), s, {});
  gc::StateDict ss = scaler.state_dict();
  gc::Buffer tracker(1, gc::DType::int32, device(), gc::MemoryKind::device);
  gc::fill_integer(tracker, 5000, s);  // beyond growth_interval
  ss["growth_tracker"] = {tracker, {}};
  EXPECT_THROW(scaler.load_state_dict(ss, s), gc::InvalidArgument);
  EXPECT_EQ(scaler.state(s).growth_tracker, 0);
  gc::fill_integer(tracker, 17, s);
  scaler.load_state_dict(ss, s);
  EXPECT_EQ(scaler.state(s).growth_tracker, 17);
}

}  // namespace
