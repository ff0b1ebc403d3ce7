// Reading checkpoints: everything verified before the first byte reaches the caller's tensors (or,
// with Verify::while_copying, each tensor's checksum as it is copied).
#include <gpucloud/checkpoint/checkpoint.hpp>
#include <gpucloud/memory/buffer.hpp>
#include <gpucloud/movement/copy.hpp>
#include <gpucloud/runtime/error.hpp>

#include "checkpoint/files.hpp"
#include "checkpoint/format.hpp"
#include "runtime/host/parallel_for.hpp"
#include "runtime/host/streaming_copy.hpp"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <functional>
#include <limits>

namespace gpucloud::checkpoint {

namespace d = detail;

namespace {

[[noreturn]] void mismatch(const std::string& what) {
  throw CheckpointMismatch("checkpoint::load", what, __FILE__, __LINE__);
}
[[noreturn]] void corrupt(const std::string& what) {
  throw CheckpointError("checkpoint::load", what, __FILE__, __LINE__);
}

// One tensor file: its size and the entries of its header (offsets made absolute).
struct CheckedFile {
  d::File file;
  std::map<std::string, d::FileEntry> entries;
};

CheckedFile open_checked(const std::string& path) {
  CheckedFile c{d::File::open_read(path), {}};
  const std::uint64_t size = c.file.size();
  if (size < 8) corrupt(path + ": " + std::to_string(size) + " bytes, too short for a safetensors file (truncated)");
  unsigned char len_bytes[8];
  c.file.read_at(len_bytes, 8, 0);
  std::uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = header_len << 8 | len_bytes[i];
  if (header_len > d::kMaxHeaderBytes || header_len > size - 8) {
    corrupt(path + ": header length " + std::to_string(header_len) + " does not fit the file of " +
            std::to_string(size) + " bytes (truncated or damaged)");
  }
  std::string header(static_cast<std::size_t>(header_len), '\0');
  c.file.read_at(header.data(), header.size(), 8);
  c.entries = d::parse_safetensors_header(header, path);
  const std::uint64_t data_start = 8 + header_len;
  std::uint64_t data_end = 0;
  for (auto& [name, e] : c.entries) {
    data_end = std::max(data_end, e.end);
    e.begin += data_start;
    e.end += data_start;
  }
  if (data_start + data_end != size) {
    corrupt(path + ": " + std::to_string(size) + " bytes, but its header describes " +
            std::to_string(data_start + data_end) + (size < data_start + data_end ? " (truncated)" : ""));
  }
  return c;
}

// Why @p directory is not a loadable checkpoint, or nullopt when it is: its manifest verifies,
// and every file it names is a regular file whose safetensors header describes the manifest's
// tensors and whose size its header (no tensor data is read: load() checks the checksums).
std::optional<std::string> invalid_reason(const std::string& directory, std::int64_t step) {
  try {
    const Manifest m = read_manifest(directory);
    if (m.step != step) {
      return directory + "/manifest.json: holds step " + std::to_string(m.step) + ", not the directory's " +
             std::to_string(step);
    }
    std::map<std::string, CheckedFile> files;
    for (const auto& f : m.files) files.emplace(f, open_checked(directory + "/" + f));
    for (const auto& [name, t] : m.tensors) {
      const auto& entries = files.at(t.file).entries;
      const auto e = entries.find(name);
      if (e == entries.end() || e->second.dtype != t.dtype || e->second.shape != t.shape ||
          e->second.begin != t.begin || e->second.end != t.end) {
        return directory + "/" + t.file + ": its header does not describe tensor '" + name + "' as the manifest does";
      }
    }
    return std::nullopt;
  } catch (const std::exception& e) {
    return std::string(e.what());
  }
}

// One tensor to load: where its bytes are in a mapped file, and where they go.
struct Piece {
  const std::string* name;
  const TensorInfo* info;
  const d::Mapping* map;
  BufferView dst;
};

// Runs fn(i) for every i in [0, n) on the host thread budget's cores, items handed out one at a
// time in order (callers sort the big ones first); the first exception is rethrown.
void for_each_item(std::size_t n, const std::function<void(std::size_t)>& fn) {
  std::atomic<std::size_t> next{0};
  const auto workers = static_cast<std::int64_t>(std::min<std::size_t>(n, gpucloud::detail::parallel_for_threads()));
  gpucloud::detail::parallel_for(std::max<std::int64_t>(workers, 1), 1, [&](std::int64_t b, std::int64_t e) {
    for (std::int64_t w = b; w < e; ++w) {
      for (std::size_t i; (i = next.fetch_add(1)) < n;) fn(i);
    }
  });
}

// Reads every tensor of @p into through a mapping of its file, checks each one's XXH3-64 (in
// parallel, tensor by tensor, largest first), and only when all match copies them into @p into
// (Verify::while_copying: host tensors are copied as they are hashed, the others after):
// host memory on the budget's cores, GPU memory in @p stream's order. No staging copy of the
// checkpoint is made: the page cache is the only one.
void verify_and_copy(const std::string& directory, const Manifest& m, const StateDict& into,
                     std::map<std::string, CheckedFile>& files, StreamView stream, Verify verify) {
  std::map<std::string, d::Mapping> maps;
  for (auto& [name, f] : files) maps.emplace(name, d::Mapping(f.file, f.file.size()));
  std::vector<Piece> pieces;
  for (const auto& [name, ref] : into) {
    const TensorInfo& t = m.tensors.at(name);
    const d::Mapping& map = maps.at(t.file);
    map.will_need(t.begin, t.end - t.begin);
    pieces.push_back({&name, &t, &map, ref.view});
  }
  std::vector<std::size_t> order(pieces.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return pieces[a].info->end - pieces[a].info->begin > pieces[b].info->end - pieces[b].info->begin;
  });
  // Verify::while_copying: host tensors are written as they are hashed, after the stream's
  // earlier work on them.
  const bool fused = verify == Verify::while_copying;
  if (fused) stream.synchronize();
  // Every byte verified (before any is written, or as it is). A failure is reported for the first
  // tensor by name.
  std::vector<std::string> failure(pieces.size());
  std::vector<char> copied(pieces.size(), 0);
  for_each_item(order.size(), [&](std::size_t k) {
    const Piece& p = pieces[order[k]];
    const std::uint64_t n = p.info->end - p.info->begin;
    try {
      p.map->populate(p.info->begin, n);
      const char* src = p.map->data() + p.info->begin;
      const bool copy = fused && p.dst.host_accessible();
      const std::uint64_t h = copy ? d::xxh3_copy(p.dst.data(), src, static_cast<std::size_t>(n))
                                   : d::xxh3(src, static_cast<std::size_t>(n));
      copied[order[k]] = copy ? 1 : 0;
      if (h != p.info->xxh3) {
        failure[order[k]] = directory + "/" + p.info->file + ": tensor '" + *p.name +
                            "' fails its checksum (the bytes were changed or damaged)";
      }
    } catch (const std::exception& e) {
      failure[order[k]] = e.what();
    }
  });
  for (const auto& why : failure) {
    if (!why.empty()) corrupt(why);
  }
  // The copies: the stream's earlier work on the tensors first.
  if (!fused) stream.synchronize();
  constexpr std::uint64_t kChunk = std::uint64_t{4} << 20;
  struct Span {
    char* dst;
    const char* src;
    std::size_t n;
  };
  std::vector<Span> spans;
  try {
    for (std::size_t i = 0; i < pieces.size(); ++i) {
      const Piece& p = pieces[i];
      const std::uint64_t n = p.info->end - p.info->begin;
      if (n == 0 || copied[i]) continue;
      const char* src = p.map->data() + p.info->begin;
      if (p.dst.host_accessible()) {
        for (std::uint64_t o = 0; o < n; o += kChunk) {
          spans.push_back(
              {static_cast<char*>(p.dst.data()) + o, src + o, static_cast<std::size_t>(std::min(kChunk, n - o))});
        }
      } else {  // from the page cache's pages, staged by the copy engine's driver
        const BufferView from(const_cast<char*>(src), static_cast<std::size_t>(n), DType::uint8, MemoryKind::host,
                              Device::host());
        const BufferView to(p.dst.data(), p.dst.size_bytes(), DType::uint8, p.dst.kind(), p.dst.device());
        copy(to, from, stream);
      }
    }
    gpucloud::detail::parallel_for(static_cast<std::int64_t>(spans.size()), 1, [&](std::int64_t b, std::int64_t e) {
      for (std::int64_t i = b; i < e; ++i) gpucloud::detail::streaming_copy(spans[i].dst, spans[i].src, spans[i].n);
    });
  } catch (...) {
    stream.synchronize();  // nothing may still read the mappings when they go
    throw;
  }
  stream.synchronize();
}
}  // namespace

LatestScan find_latest(const std::string& root) {
  d::check_path_argument(root, "checkpoint::latest", "root");
  std::vector<std::int64_t> steps;
  for (const auto& name : d::list_directory(root)) {
    std::int64_t step = 0;
    if (d::step_of_directory_name(name, step)) steps.push_back(step);
  }
  std::sort(steps.begin(), steps.end(), std::greater<>());
  LatestScan scan;
  for (const std::int64_t step : steps) {
    const std::string dir = root + "/" + directory_name(step);
    if (auto why = invalid_reason(dir, step)) {
      scan.skipped.push_back({dir, std::move(*why)});
      continue;
    }
    scan.directory = dir;
    break;
  }
  return scan;
}

std::optional<std::string> latest(const std::string& root) {
  LatestScan scan = find_latest(root);
  for (const auto& s : scan.skipped) {
    std::fprintf(stderr, "gpucloud: warning: checkpoint::latest skips %s: %s\n", s.directory.c_str(), s.reason.c_str());
  }
  return std::move(scan.directory);
}

Manifest read_manifest(const std::string& directory) {
  d::check_path_argument(directory, "checkpoint::read_manifest", "directory");
  const std::string path = directory + "/manifest.json";
  if (!d::exists(directory)) corrupt(directory + ": no such checkpoint directory");
  if (!d::exists(path)) corrupt(path + ": missing (not a committed checkpoint)");
  Manifest m = d::decode_manifest(d::read_file(path, d::kMaxManifestBytes), path);
  m.directory = directory;
  return m;
}

Manifest load(const std::string& directory, const StateDict& into, StreamView stream, bool strict, Verify verify) {
  d::check_path_argument(directory, "checkpoint::load", "directory");
  if (verify != Verify::before_writing && verify != Verify::while_copying) {
    throw InvalidArgument("checkpoint::load",
                          "verify: " + std::to_string(static_cast<int>(verify)) + " is not a Verify value", __FILE__,
                          __LINE__);
  }
  // The caller's side first: names and shapes of what it passes.
  std::map<std::string, std::vector<std::int64_t>> shapes;
  for (const auto& [name, ref] : into) shapes[name] = shape_of(ref, "into['" + name + "']");
  const Manifest m = read_manifest(directory);
  const std::string manifest_path = directory + "/manifest.json";
  for (const auto& [name, ref] : into) {
    auto it = m.tensors.find(name);
    if (it == m.tensors.end()) {
      mismatch(manifest_path + ": no tensor '" + name + "' in the checkpoint (of step " + std::to_string(m.step) + ")");
    }
    const TensorInfo& t = it->second;
    if (t.dtype != ref.view.dtype()) {
      mismatch("tensor '" + name + "' in " + t.file + ": " + dtype_name(t.dtype) + " in the checkpoint, " +
               dtype_name(ref.view.dtype()) + " in into");
    }
    if (t.shape != shapes[name]) {
      mismatch("tensor '" + name + "' in " + t.file + ": shape " + d::shape_str(t.shape) + " in the checkpoint, " +
               d::shape_str(shapes[name]) + " in into");
    }
  }
  if (strict) {
    for (const auto& [name, t] : m.tensors) {
      if (into.count(name) == 0) {
        mismatch("tensor '" + name + "' in " + t.file + ": in the checkpoint but not in into (strict load)");
      }
    }
  }
  // Every file needed: its header must describe the manifest's tensors exactly, its size the header.
  std::map<std::string, CheckedFile> files;
  for (const auto& [name, ref] : into) {
    const TensorInfo& t = m.tensors.at(name);
    auto f = files.find(t.file);
    if (f == files.end()) f = files.emplace(t.file, open_checked(directory + "/" + t.file)).first;
    auto e = f->second.entries.find(name);
    if (e == f->second.entries.end() || e->second.dtype != t.dtype || e->second.shape != t.shape ||
        e->second.begin != t.begin || e->second.end != t.end) {
      corrupt(directory + "/" + t.file + ": its header does not describe tensor '" + name + "' as the manifest does");
    }
  }
  verify_and_copy(directory, m, into, files, stream, verify);
  return m;
}

}  // namespace gpucloud::checkpoint
