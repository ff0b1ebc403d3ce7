// Internal: how measure_cost_model() turns repeated timings into one model (not API).
#pragma once

#include <gpucloud/comm/cost_model.hpp>

#include <algorithm>
#include <vector>

namespace gpucloud::detail {

/// Fits each link this many times, interleaved: one fit of about a second can meet a busy moment
/// (on 2 x 3 network-namespace nodes one measured shared memory slower than a 1 Gbit/s link, and
/// a fit minutes later flipped every choice all_reduce_auto made).
inline constexpr int kCostModelFits = 3;

/// Each parameter's median over @p fits (not empty).
inline LinkCost median_link(std::vector<LinkCost> fits) {
  const auto mid = fits.begin() + static_cast<std::ptrdiff_t>(fits.size() / 2);
  std::nth_element(fits.begin(), mid, fits.end(),
                   [](const LinkCost& a, const LinkCost& b) { return a.alpha < b.alpha; });
  LinkCost out;
  out.alpha = mid->alpha;
  std::nth_element(fits.begin(), mid, fits.end(), [](const LinkCost& a, const LinkCost& b) { return a.beta < b.beta; });
  out.beta = mid->beta;
  return out;
}

/// The model's links from the fits of each (@p inter_fits empty on one node): medians, and a node's
/// own link never slower than the network's (a fit that says so measured a busy moment, not the
/// link; the choice then rests on how much each form sends across the network).
inline void set_links(AllReduceCostModel& m, const std::vector<LinkCost>& intra_fits,
                      const std::vector<LinkCost>& inter_fits) {
  m.intra = median_link(intra_fits);
  m.inter = inter_fits.empty() ? m.intra : median_link(inter_fits);
  if (!inter_fits.empty()) {
    m.intra.alpha = std::min(m.intra.alpha, m.inter.alpha);
    m.intra.beta = std::min(m.intra.beta, m.inter.beta);
  }
}

}  // namespace gpucloud::detail
