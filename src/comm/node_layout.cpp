#include "comm/node_layout.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstddef>

namespace gpucloud::detail {

NodeLayout node_layout(const std::vector<std::uint64_t>& keys, int rank) {
  NodeLayout l;
  std::vector<std::uint64_t> seen;  // node keys in order of their first rank
  std::vector<int> counts;
  for (std::size_t r = 0; r < keys.size(); ++r) {
    const auto at = std::find(seen.begin(), seen.end(), keys[r]);
    const auto n = static_cast<std::size_t>(at - seen.begin());
    if (at == seen.end()) {
      seen.push_back(keys[r]);
      counts.push_back(0);
    }
    if (static_cast<int>(r) == rank) {
      l.node = static_cast<int>(n);
      l.local_rank = counts[n];
    }
    ++counts[n];
  }
  l.nodes = static_cast<int>(seen.size());
  l.local_size = counts.empty() ? 1 : counts[static_cast<std::size_t>(l.node)];
  l.uniform = std::all_of(counts.begin(), counts.end(), [&](int c) { return c == counts.front(); });
  return l;
}

NodeLayout block_layout(int rank, int size, int local_size) {
  return NodeLayout{rank % local_size, local_size, rank / local_size, size / local_size, true};
}

std::uint64_t host_key() {
  char name[256] = {};
  gethostname(name, sizeof name - 1);
  std::uint64_t h = 14695981039346656037ull;
  for (const char* c = name; *c != '\0'; ++c) h = (h ^ static_cast<unsigned char>(*c)) * 1099511628211ull;
  return h;
}

}  // namespace gpucloud::detail
