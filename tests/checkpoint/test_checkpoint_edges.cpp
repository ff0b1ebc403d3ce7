// Checkpoints at the edges faults reach: the directory rules (a run restarted from an older step,
// steps of every width, rotation), hostile files (junk, deeply nested or non-regular manifests and
// tensor files, names with a NUL), the fallback of latest() to the newest valid checkpoint, and
// the writer's progress. CTest runs every case in its own process, so a crash fails one case.
#include <gpucloud/gpucloud.hpp>

#include <gtest/gtest.h>

#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <string>
#include <vector>

namespace gc = gpucloud;
namespace ck = gpucloud::checkpoint;
namespace fs = std::filesystem;

namespace {

std::string fresh_dir() {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  const fs::path p = fs::temp_directory_path() / ("gpucloud_ckedge_" + std::to_string(::getpid())) /
                     (std::string(info->test_suite_name()) + "_" + info->name());
  fs::remove_all(p);
  fs::create_directories(p);
  return p.string();
}

std::vector<std::string> entries(const std::string& root) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(root)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

std::vector<std::string> committed(const std::string& root) {
  std::vector<std::string> out;
  for (const auto& n : entries(root)) {
    if (n.find('.') == std::string::npos) out.push_back(n);
  }
  return out;
}

std::size_t count_with(const std::string& root, const std::string& infix) {
  const auto names = entries(root);
  return static_cast<std::size_t>(std::count_if(
      names.begin(), names.end(), [&](const std::string& n) { return n.find(infix) != std::string::npos; }));
}

// A small state whose values say which step wrote it.
struct State {
  gc::Buffer w{16, gc::DType::float32};
  gc::StateDict dict() { return {{"w", {w, {}}}}; }
  void fill(float v) {
    for (std::size_t i = 0; i < w.size(); ++i) w.data_as<float>()[i] = v;
  }
  float value() const { return w.data_as<float>()[0]; }
};

template <class E>
std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "another error type: " << e.what();
    return {};
  }
  ADD_FAILURE() << "no error";
  return {};
}

void write_text(const std::string& path, const std::string& text) { std::ofstream(path, std::ios::binary) << text; }

}  // namespace

// ---- the directory rules -----------------------------------------------------------------------

TEST(CheckpointRestart, ASaveBelowNewerStepsKeepsItselfAndSupersedesThem) {
  gc::Stream s;
  const std::string root = fresh_dir();
  State st;
  ck::Options o;
  o.keep_last = 2;
  {
    ck::Checkpointer first(root, o);
    for (int step : {10, 20}) {
      st.fill(static_cast<float>(step));
      first.save(step, st.dict(), s);
    }
  }
  // The run restarts from step 5 (an older checkpoint) into the same root and saves step 5.
  ck::Checkpointer again(root, o);
  st.fill(5);
  again.save(5, st.dict(), s);
  EXPECT_EQ(committed(root), (std::vector<std::string>{"step-000000000005"}));
  EXPECT_EQ(*ck::latest(root), root + "/step-000000000005");
  EXPECT_EQ(count_with(root, ".superseded-"), 2u) << "the newer checkpoints are moved aside, not deleted";
  // Rotation counts the new run's checkpoints only, and always keeps the one just written.
  for (int step : {6, 7}) {
    st.fill(static_cast<float>(step));
    again.save(step, st.dict(), s);
  }
  EXPECT_EQ(committed(root), (std::vector<std::string>{"step-000000000006", "step-000000000007"}));
  EXPECT_EQ(count_with(root, ".superseded-"), 2u) << "superseded checkpoints are the user's to delete";
  st.fill(0);
  ck::load(*ck::latest(root), st.dict(), s);
  EXPECT_EQ(st.value(), 7.0f);
  // A superseded checkpoint still loads by its directory.
  for (const auto& n : entries(root)) {
    if (n.rfind("step-000000000020.superseded-", 0) == 0) {
      ck::load(root + "/" + n, st.dict(), s);
      EXPECT_EQ(st.value(), 20.0f);
    }
  }
}

TEST(CheckpointRestart, KeepLastOneKeepsExactlyTheCheckpointJustWritten) {
  gc::Stream s;
  const std::string root = fresh_dir();
  State st;
  ck::Options o;
  o.keep_last = 1;
  ck::Checkpointer writer(root, o);
  for (int step : {3, 9, 4, 4, 2}) {
    st.fill(static_cast<float>(step));
    writer.save(step, st.dict(), s);
    EXPECT_EQ(committed(root), std::vector<std::string>{ck::directory_name(step)}) << "after saving " << step;
  }
}

TEST(CheckpointSteps, EveryInt64StepRoundTripsThroughLatestAndRotation) {
  gc::Stream s;
  const std::string root = fresh_dir();
  State st;
  ck::Options o;
  o.keep_last = 2;
  ck::Checkpointer writer(root, o);
  const std::int64_t max = std::numeric_limits<std::int64_t>::max();
  const std::vector<std::int64_t> steps = {0, 999'999'999'999, 1'000'000'000'000, 123'456'789'012'345, max - 1, max};
  for (std::size_t i = 0; i < steps.size(); ++i) {
    st.fill(static_cast<float>(i));
    writer.save(steps[i], st.dict(), s);
    const auto dir = ck::latest(root);
    ASSERT_TRUE(dir.has_value());
    EXPECT_EQ(*dir, root + "/" + ck::directory_name(steps[i]));
    EXPECT_EQ(ck::read_manifest(*dir).step, steps[i]);
    EXPECT_LE(committed(root).size(), 2u);
  }
  EXPECT_EQ(ck::directory_name(max), "step-9223372036854775807");
  EXPECT_EQ(committed(root), (std::vector<std::string>{ck::directory_name(max - 1), ck::directory_name(max)}));
}

TEST(CheckpointSteps, NamesThatAreNotExactlyAStepsNameAreNotCheckpoints) {
  gc::Stream s;
  const std::string root = fresh_dir();
  State st;
  ck::Checkpointer(root).save(7, st.dict(), s);
  // Copies under names latest() must not take: an extra leading zero, past int64, too short,
  // a sign, and a superseded one of a higher step.
  for (const char* name : {"step-0000000000009", "step-99999999999999999999", "step-00000000009", "step-+00000000009",
                           "step-000000000099.superseded-0123456789abcdef", "step-000000000099.tmp-0123456789abcdef"}) {
    fs::copy(root + "/step-000000000007", root + "/" + name);
  }
  EXPECT_EQ(*ck::latest(root), root + "/step-000000000007");
}

// ---- latest(): the newest valid one, and why the others were skipped --------------------------

TEST(CheckpointLatest, FallsBackToTheNewestValidCheckpointAndSaysWhy) {
  gc::Stream s;
  const std::string root = fresh_dir();
  State st;
  {
    ck::Checkpointer writer(root);
    for (int step = 1; step <= 6; ++step) {
      st.fill(static_cast<float>(step));
      writer.save(step, st.dict(), s);
    }
  }
  write_text(root + "/step-000000000006/manifest.json", "{ junk");          // not JSON
  fs::remove(root + "/step-000000000005/rank-00000.safetensors");           // a file missing
  fs::resize_file(root + "/step-000000000004/rank-00000.safetensors", 20);  // truncated
  fs::remove_all(root + "/step-000000000003");                              // a copy of
  fs::copy(root + "/step-000000000001", root + "/step-000000000003");       // another step
  const ck::LatestScan scan = ck::find_latest(root);
  ASSERT_TRUE(scan.directory.has_value());
  EXPECT_EQ(*scan.directory, root + "/step-000000000002");
  ASSERT_EQ(scan.skipped.size(), 4u);
  const std::vector<std::pair<std::string, std::string>> want = {{"step-000000000006", "not JSON"},
                                                                 {"step-000000000005", "No such file"},
                                                                 {"step-000000000004", "truncated"},
                                                                 {"step-000000000003", "holds step 1"}};
  for (std::size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(scan.skipped[i].directory, root + "/" + want[i].first);
    EXPECT_NE(scan.skipped[i].reason.find(want[i].second), std::string::npos) << scan.skipped[i].reason;
  }
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(*ck::latest(root), root + "/step-000000000002");
  const std::string warned = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(warned.find("skips " + root + "/step-000000000006"), std::string::npos) << warned;
  EXPECT_NE(warned.find("skips " + root + "/step-000000000003"), std::string::npos) << warned;
  ck::load(*ck::latest(root), st.dict(), s);
  EXPECT_EQ(st.value(), 2.0f);
}

TEST(CheckpointLatest, NoValidCheckpointIsNoneWithEveryReason) {
  const std::string root = fresh_dir();
  fs::create_directories(root + "/step-000000000001");
  fs::create_directories(root + "/step-000000000002/manifest.json");  // a directory, not a file
  const ck::LatestScan scan = ck::find_latest(root);
  EXPECT_FALSE(scan.directory.has_value());
  ASSERT_EQ(scan.skipped.size(), 2u);
  EXPECT_NE(scan.skipped[0].reason.find("a directory"), std::string::npos) << scan.skipped[0].reason;
  EXPECT_NE(scan.skipped[1].reason.find("missing"), std::string::npos) << scan.skipped[1].reason;
}

// ---- hostile files ----------------------------------------------------------------------------

class CheckpointHostile : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fresh_dir();
    st_.fill(1);
    ck::Checkpointer(root_).save(1, st_.dict(), s_);
    st_.fill(2);
    ck::Checkpointer(root_).save(2, st_.dict(), s_);
    dir_ = root_ + "/step-000000000002";
    st_.fill(0);
  }
  // load() of the newest fails with CheckpointError naming @p word, the state untouched; latest()
  // skips it for step 1.
  void expect_refused(const std::string& word) {
    const std::string what = error_of<gc::CheckpointError>([&] { ck::load(dir_, st_.dict(), s_); });
    EXPECT_NE(what.find(word), std::string::npos) << what;
    EXPECT_EQ(st_.value(), 0.0f) << "written before the error";
    const auto scan = ck::find_latest(root_);
    EXPECT_EQ(scan.directory.value_or(""), root_ + "/step-000000000001");
    ASSERT_EQ(scan.skipped.size(), 1u);
    EXPECT_NE(scan.skipped[0].reason.find(word), std::string::npos) << scan.skipped[0].reason;
  }
  gc::Stream s_;
  State st_;
  std::string root_, dir_;
};

TEST_F(CheckpointHostile, AManifestNestedTwoHundredThousandLevelsDeep) {
  write_text(dir_ + "/manifest.json", std::string(200'000, '[') + std::string(200'000, ']'));
  expect_refused("nested deeper");
}

TEST_F(CheckpointHostile, ObjectsNestedInsideTheManifestsBody) {
  std::string nested;
  for (int i = 0; i < 5000; ++i) nested += "{\"a\":";
  nested += "1" + std::string(5000, '}');
  write_text(dir_ + "/manifest.json", "{\"body\": " + nested + ", \"xxh3_64\": \"0000000000000000\"}");
  expect_refused("nested deeper");
}

TEST_F(CheckpointHostile, BracketsInsideStringsAreNotNesting) {
  // A manifest whose metadata holds thousands of brackets in a string is a valid manifest.
  State st;
  st.fill(3);
  ck::Checkpointer(root_).save(3, st.dict(), s_, {{"brackets", std::string(10'000, '[') + "\"\\"}});
  ck::load(root_ + "/step-000000000003", st_.dict(), s_);
  EXPECT_EQ(st_.value(), 3.0f);
}

TEST_F(CheckpointHostile, ASafetensorsHeaderNestedDeep) {
  const std::string file = dir_ + "/rank-00000.safetensors";
  const std::string header = std::string(100'000, '[') + std::string(100'000, ']');
  std::string bytes(8, '\0');
  for (int i = 0; i < 8; ++i) bytes[static_cast<std::size_t>(i)] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
  write_text(file, bytes + header);
  const std::string what = error_of<gc::CheckpointError>([&] { ck::load(dir_, st_.dict(), s_); });
  EXPECT_NE(what.find("nested deeper"), std::string::npos) << what;
  EXPECT_EQ(st_.value(), 0.0f);
}

TEST_F(CheckpointHostile, AFifoAsTheManifestIsRefusedWithoutBlocking) {
  fs::remove(dir_ + "/manifest.json");
  ASSERT_EQ(::mkfifo((dir_ + "/manifest.json").c_str(), 0644), 0);
  expect_refused("a FIFO");
}

TEST_F(CheckpointHostile, AFifoAsATensorFileIsRefusedWithoutBlocking) {
  fs::remove(dir_ + "/rank-00000.safetensors");
  ASSERT_EQ(::mkfifo((dir_ + "/rank-00000.safetensors").c_str(), 0644), 0);
  expect_refused("a FIFO");
}

TEST_F(CheckpointHostile, ADirectoryAsATensorFile) {
  fs::remove(dir_ + "/rank-00000.safetensors");
  fs::create_directories(dir_ + "/rank-00000.safetensors");
  expect_refused("a directory");
}

TEST_F(CheckpointHostile, ASymlinkToADeviceAsTheManifest) {
  fs::remove(dir_ + "/manifest.json");
  fs::create_symlink("/dev/zero", dir_ + "/manifest.json");
  expect_refused("character device");
}

TEST_F(CheckpointHostile, AManifestLargerThanAnyManifestIsRefusedBeforeReading) {
  fs::resize_file(dir_ + "/manifest.json", (std::uintmax_t{1} << 28) + 1);  // sparse: no disk used
  expect_refused("more than the");
}

TEST_F(CheckpointHostile, AShapeWithTooManyDimensions) {
  // A well-formed, correctly checksummed manifest cannot be forged here without the library's
  // encoder; a safetensors header can: 65 dimensions of 1.
  std::string shape = "[";
  for (int i = 0; i < 65; ++i) shape += (i ? ",1" : "1");
  shape += "]";
  const std::string header = "{\"w\":{\"dtype\":\"F32\",\"shape\":" + shape + ",\"data_offsets\":[0,4]}}";
  std::string bytes(8, '\0');
  for (int i = 0; i < 8; ++i) bytes[static_cast<std::size_t>(i)] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
  write_text(dir_ + "/rank-00000.safetensors", bytes + header + std::string(4, '\0'));
  const std::string what = error_of<gc::CheckpointError>([&] { ck::load(dir_, st_.dict(), s_); });
  EXPECT_NE(what.find("dimensions"), std::string::npos) << what;
}

// ---- paths ------------------------------------------------------------------------------------

TEST(CheckpointPaths, ANulInAPathIsRefusedByName) {
  gc::Stream s;
  State st;
  const std::string root = fresh_dir();
  const std::string with_nul = root + std::string("/a\0b", 4);
  auto expect_nul = [](const std::string& what, const char* arg) {
    EXPECT_NE(what.find("NUL"), std::string::npos) << what;
    EXPECT_NE(what.find(arg), std::string::npos) << what;
  };
  expect_nul(error_of<gc::InvalidArgument>([&] { ck::Checkpointer c(with_nul); }), "root");
  expect_nul(error_of<gc::InvalidArgument>([&] { (void)ck::latest(with_nul); }), "root");
  expect_nul(error_of<gc::InvalidArgument>([&] { (void)ck::read_manifest(with_nul); }), "directory");
  expect_nul(error_of<gc::InvalidArgument>([&] { ck::load(with_nul, st.dict(), s); }), "directory");
  EXPECT_TRUE(fs::is_empty(root)) << "nothing created under the truncated path";
}

TEST(CheckpointPaths, NamesThatAreNotUtf8WorkAsTheFileSystemHasThem) {
  gc::Stream s;
  State st;
  const std::string root = fresh_dir() + "/caf\xe9";  // Latin-1, not UTF-8
  st.fill(4);
  ck::Checkpointer(root).save(4, st.dict(), s);
  st.fill(0);
  ck::load(*ck::latest(root), st.dict(), s);
  EXPECT_EQ(st.value(), 4.0f);
}

// ---- the writer's progress ----------------------------------------------------------------------

TEST(CheckpointProgress, ReportsTheSaveInFlightTheLastCommitAndFailures) {
  gc::Stream s;
  State st;
  const std::string root = fresh_dir();
  ck::Checkpointer writer(root);
  ck::Progress p = writer.progress();
  EXPECT_FALSE(p.writing_step.has_value());
  EXPECT_FALSE(p.committed_step.has_value());
  EXPECT_EQ(p.saves_committed, 0u);
  ck::PendingSave pending = writer.save_async(11, st.dict(), s);
  p = writer.progress();
  if (!pending.done()) {
    EXPECT_EQ(p.writing_step.value_or(-1), 11) << "in flight and not reported";
  }
  pending.wait();
  writer.save_async(12, st.dict(), s);  // waits for nothing: 11 is done
  writer.wait();
  p = writer.progress();
  EXPECT_FALSE(p.writing_step.has_value());
  EXPECT_EQ(p.committed_step.value_or(-1), 12);
  EXPECT_EQ(p.saves_committed, 2u);
  EXPECT_EQ(p.saves_failed, 0u);
  EXPECT_GE(p.seconds_since_commit, 0.0);
  EXPECT_GT(p.committed_unix_time, 1.6e9);
  EXPECT_GT(p.last_save_seconds, 0.0);
  // A save that fails (its root replaced by a file) counts as failed; the last commit stays.
  fs::remove_all(root);
  write_text(root, "not a directory");
  EXPECT_THROW(writer.save(13, st.dict(), s), gc::CheckpointError);
  p = writer.progress();
  EXPECT_EQ(p.saves_failed, 1u);
  EXPECT_EQ(p.committed_step.value_or(-1), 12);
  EXPECT_FALSE(p.writing_step.has_value());
}
