#include <gpucloud/comm/cost_model.hpp>
#include <gpucloud/runtime/error.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <regex>
#include <sstream>

namespace gpucloud {

namespace {
double ring(int p, double bytes, LinkCost link) {
  if (p <= 1) return 0.0;
  return 2.0 * (p - 1) * link.alpha + 2.0 * (p - 1) / p * bytes * link.beta;
}
// Recursive halving then doubling over p ranks: log2(p) steps each way, (p-1)/p of S sent each way.
double halving(int p, double bytes, LinkCost link) {
  if (p <= 1) return 0.0;
  return 2.0 * std::log2(static_cast<double>(p)) * link.alpha + 2.0 * (p - 1) / p * bytes * link.beta;
}
}  // namespace

double AllReduceCostModel::flat_seconds(std::size_t bytes) const noexcept {
  const double s = static_cast<double>(bytes);
  if (flat_halving && nodes > 1) return halving(local_size, s, intra) + halving(nodes, s / local_size, inter);
  return ring(local_size * nodes, s, nodes > 1 ? inter : intra);
}

double AllReduceCostModel::hierarchical_seconds(std::size_t bytes) const noexcept {
  const double s = static_cast<double>(bytes);
  const int l = local_size;
  const double local_half = l > 1 ? (l - 1) * intra.alpha + (l - 1) * (s / l) * intra.beta : 0.0;
  return 2.0 * local_half + ring(nodes, s / l, inter);
}

bool AllReduceCostModel::ties(std::size_t bytes) const noexcept {
  const double flat = flat_seconds(bytes), hier = hierarchical_seconds(bytes);
  return std::abs(flat - hier) <= kTie * std::min(flat, hier);
}

std::string AllReduceCostModel::to_json() const {
  char text[512];
  std::snprintf(text, sizeof text,
                "{\"intra_alpha\": %.9g, \"intra_beta\": %.9g, \"inter_alpha\": %.9g, \"inter_beta\": %.9g, "
                "\"local_size\": %d, \"nodes\": %d, \"flat_halving\": %d}",
                intra.alpha, intra.beta, inter.alpha, inter.beta, local_size, nodes, flat_halving ? 1 : 0);
  return text;
}

AllReduceCostModel AllReduceCostModel::from_json(const std::string& json) {
  AllReduceCostModel m;
  auto number = [&](const char* key, bool required = true) {
    const std::regex re(std::string("\"") + key + "\"\\s*:\\s*([-+0-9.eE]+)");
    std::smatch match;
    if (!std::regex_search(json, match, re)) {
      if (!required) return 0.0;
      GPUCLOUD_FAIL(InvalidArgument, "AllReduceCostModel::from_json", std::string("json: no \"") + key + "\"");
    }
    return std::stod(match[1].str());
  };
  m.intra = {number("intra_alpha"), number("intra_beta")};
  m.inter = {number("inter_alpha"), number("inter_beta")};
  m.local_size = static_cast<int>(number("local_size"));
  m.nodes = static_cast<int>(number("nodes"));
  m.flat_halving = number("flat_halving", false) != 0.0;  // absent in models saved before it existed
  GPUCLOUD_EXPECTS(m.local_size >= 1 && m.nodes >= 1, "AllReduceCostModel::from_json", "json: sizes must be positive");
  return m;
}

}  // namespace gpucloud
