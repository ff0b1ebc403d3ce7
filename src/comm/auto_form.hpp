// Internal: all_reduce_auto()'s measured choice where the cost model's predictions tie (not API).
#pragma once

#include <gpucloud/comm/communicator.hpp>

#include <algorithm>
#include <array>
#include <cstddef>
#include <optional>

namespace gpucloud::detail {

/// The size class of @p bytes: its power of two (0 for 0 and 1 byte).
inline int auto_size_class(std::size_t bytes) {
  int c = 0;
  while (bytes > 1) {
    bytes >>= 1;
    ++c;
  }
  return c;
}

/// One size class's trials: flat and hierarchical alternate, flat first, kCalls timed calls each;
/// then the slowest rank's times (a max over ranks, the same on every rank) decide by their
/// medians, once (a median drops the odd call that met a busy moment or a first touch).
class AutoFormTrials {
 public:
  static constexpr int kCalls = 3;
  using Seconds = std::array<double, 2 * kCalls>;  // flat at even indexes, hierarchical at odd

  /// The form the next call takes.
  AllReduceForm next() const {
    if (decided_) return *decided_;
    return calls_ % 2 == 0 ? AllReduceForm::flat : AllReduceForm::hierarchical;
  }
  /// The decided form, or measuring.
  AllReduceForm form() const { return decided_ ? *decided_ : AllReduceForm::measuring; }
  /// Records one trial call's @p seconds; true when the trials are complete (decide() comes next;
  /// a call after trials whose combination failed adds nothing and is true again).
  bool record(double seconds) {
    if (calls_ < 2 * kCalls) seconds_[static_cast<std::size_t>(calls_++)] = seconds;
    return calls_ == 2 * kCalls;
  }
  /// This rank's trial times, to be combined over ranks.
  Seconds& seconds() { return seconds_; }
  /// Decides from @p slowest (every rank's trial times, max over ranks): the lower median, flat
  /// when equal.
  void decide(const Seconds& slowest) { decided_ = faster(slowest); }

  /// The form with the lower median of @p slowest's times; flat when equal.
  static AllReduceForm faster(const Seconds& slowest) {
    std::array<double, kCalls> flat{}, hier{};
    for (int i = 0; i < kCalls; ++i) {
      flat[static_cast<std::size_t>(i)] = slowest[static_cast<std::size_t>(2 * i)];
      hier[static_cast<std::size_t>(i)] = slowest[static_cast<std::size_t>(2 * i + 1)];
    }
    std::sort(flat.begin(), flat.end());
    std::sort(hier.begin(), hier.end());
    return hier[kCalls / 2] < flat[kCalls / 2] ? AllReduceForm::hierarchical : AllReduceForm::flat;
  }

 private:
  Seconds seconds_{};
  int calls_ = 0;
  std::optional<AllReduceForm> decided_;
};

}  // namespace gpucloud::detail
