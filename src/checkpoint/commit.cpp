// The commit of a checkpoint and the directory rules: rank 0 assembles the manifest from every
// rank's marker, moves newer checkpoints of a restarted run aside, replaces an earlier run's
// checkpoint of the same step, renames the directory into place, rotates, and removes what
// interrupted saves left (docs/checkpoint.md#how-a-save-commits).
#include "checkpoint/checkpointer_impl.hpp"
#include "checkpoint/format.hpp"

#include <algorithm>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

namespace gpucloud::checkpoint {

using nlohmann::json;
namespace d = detail;
using d::marker_file;
using d::poll;
using d::random_id;
using d::rank_file;
using d::read_error_marker;

void Checkpointer::Impl::commit(const std::string& tmp, const std::string& final_dir, std::int64_t step,
                                std::uint64_t layout, const json& own, const std::vector<d::Item>& all,
                                const Metadata& metadata) {
  std::vector<json> markers(static_cast<std::size_t>(world));
  markers[0] = own;
  d::QuietDirectory quiet(tmp);
  for (int r = 1; r < world; ++r) {
    const std::string path = tmp + "/" + marker_file(r, "json");
    poll([&] { return d::exists(path); },
         [&]() -> std::optional<std::string> {
           auto e = read_error_marker(tmp + "/" + marker_file(r, "error"));
           if (e) return "rank " + std::to_string(r) + " failed to write its file: " + *e;
           return peers_lost(quiet, "rank " + std::to_string(r));
         },
         options.commit_timeout, "rank " + std::to_string(r) + "'s file in " + tmp);
    try {
      const std::string text = d::read_file(path, d::kMaxManifestBytes);
      d::check_json_depth(text, path);
      markers[static_cast<std::size_t>(r)] = json::parse(text);
    } catch (const json::exception& e) {
      throw CheckpointError("checkpoint commit", path + ": not JSON (" + e.what() + ")", __FILE__, __LINE__);
    }
    if (markers[static_cast<std::size_t>(r)].value("layout", "") != d::hex64(layout)) {
      throw CheckpointError("checkpoint commit",
                            "rank " + std::to_string(r) +
                                " saved another step or other tensors (names, dtypes or "
                                "shapes) than rank 0: every rank must save the same state",
                            __FILE__, __LINE__);
    }
  }
  Manifest m;
  m.step = step;
  m.world_size = world;
  for (int r = 0; r < world; ++r) m.files.push_back(rank_file(r));
  m.metadata = metadata;
  m.metadata["gpucloud.run"] = d::hex64(run_id);
  for (const auto& it : all) {
    const json& t = markers[static_cast<std::size_t>(it.rank)]["tensors"];
    if (!t.contains(it.name)) {
      throw CheckpointError("checkpoint commit", "rank " + std::to_string(it.rank) + " did not write '" + it.name + "'",
                            __FILE__, __LINE__);
    }
    TensorInfo info;
    info.dtype = it.view.dtype();
    info.shape = it.shape;
    info.file = rank_file(it.rank);
    info.begin = t[it.name]["begin"].get<std::uint64_t>();
    info.end = t[it.name]["end"].get<std::uint64_t>();
    info.xxh3 = std::stoull(t[it.name]["xxh3_64"].get<std::string>(), nullptr, 16);
    m.tensors.emplace(it.name, std::move(info));
  }
  d::write_file(tmp + "/manifest.json", d::encode_manifest(m));
  for (int r = 1; r < world; ++r) std::remove((tmp + "/" + marker_file(r, "json")).c_str());
  d::sync_directory(tmp);
  clean_up(step, tmp);
  // Checkpoints of higher steps belong to a run that was restarted from an older checkpoint (this
  // one's past): moved aside first, so that latest() never returns them again.
  supersede_newer(step);
  // A checkpoint of the same step from an earlier run is replaced.
  std::string old;
  if (d::exists(final_dir)) {
    old = final_dir + ".old-" + d::hex64(run_id);
    d::remove_all_quietly(old);
    d::rename_durably(final_dir, old);
  }
  d::rename_durably(tmp, final_dir);
  if (!old.empty()) d::remove_all_quietly(old);
  rotate(step);
  d::sync_directory(root);
}

void Checkpointer::Impl::supersede_newer(std::int64_t step) {
  for (const auto& name : d::list_directory(root)) {
    std::int64_t s = 0;
    if (!d::step_of_directory_name(name, s) || s <= step) continue;
    const std::string from = root + "/" + name;
    const std::string to = from + ".superseded-" + d::hex64(random_id());
    std::fprintf(stderr,
                 "gpucloud: checkpoint %s is superseded by step %lld (the run restarted from an older step): "
                 "moved to %s\n",
                 from.c_str(), static_cast<long long>(step), to.c_str());
    d::rename_durably(from, to);
  }
}

// keep_last: the checkpoint just written (the highest step once newer ones are superseded) and
// the keep_last - 1 highest below it; lower ones deleted. Superseded directories are not counted.
void Checkpointer::Impl::rotate(std::int64_t step) {
  if (options.keep_last <= 0) return;
  std::vector<std::int64_t> older;
  for (const auto& name : d::list_directory(root)) {
    std::int64_t s = 0;
    if (d::step_of_directory_name(name, s) && s < step) older.push_back(s);
  }
  std::sort(older.begin(), older.end(), std::greater<>());
  const auto keep_older = static_cast<std::size_t>(options.keep_last - 1);
  for (std::size_t i = keep_older; i < older.size(); ++i) {
    d::remove_all_quietly(root + "/" + directory_name(older[i]));
  }
}

// Removes what interrupted saves left: temporary (.tmp-) and replaced (.old-) directories of other
// runs, and of this run for earlier steps. (One training run writes to a root at a time.)
// Superseded directories and anything else are the user's.
void Checkpointer::Impl::clean_up(std::int64_t step, const std::string& keep_tmp) {
  const std::string keep = keep_tmp.substr(keep_tmp.find_last_of('/') + 1);
  for (const auto& name : d::list_directory(root)) {
    if (name == keep) continue;
    const auto dot = name.find('.');
    if (dot == std::string::npos) continue;  // committed
    if (name.compare(dot, 5, ".tmp-") != 0 && name.compare(dot, 5, ".old-") != 0) continue;
    std::int64_t s = 0;
    if (!d::step_of_directory_name(name.substr(0, dot), s)) continue;
    const bool ours = name.find(d::hex64(run_id)) != std::string::npos;
    if (!ours || s < step) d::remove_all_quietly(root + "/" + name);
  }
}

}  // namespace gpucloud::checkpoint
