/// @file state_dict.hpp
/// @brief Named tensors: what the optimizers and the loss scaler export, and what checkpoints hold.
#pragma once

#include <gpucloud/export.hpp>
#include <gpucloud/memory/buffer.hpp>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace gpucloud {

/// @brief A view and its logical row-major shape; an empty shape means 1-D, {view.size()}.
struct TensorRef {
  BufferView view;                  ///< the memory (not owned)
  std::vector<std::int64_t> shape;  ///< dimensions, whose product is view.size(); empty: 1-D
};

/// @brief Named tensors in name order, like torch's state_dict(): views of live state, no copies.
using StateDict = std::map<std::string, TensorRef>;

/// @brief The shape of @p ref (named @p name in errors): its own, or {size} when it has none.
/// @throws InvalidArgument for a negative dimension or a product other than the view's size.
GPUCLOUD_API std::vector<std::int64_t> shape_of(const TensorRef& ref, const std::string& name);

/// @brief Adds every entry of @p from to @p into, each name prefixed with @p prefix.
/// @throws InvalidArgument when a name is already in @p into (nothing is added then).
GPUCLOUD_API void merge_state(StateDict& into, const std::string& prefix, const StateDict& from);

/// @brief The entries of @p from whose names start with @p prefix, the prefix removed.
GPUCLOUD_API StateDict sub_state(const StateDict& from, const std::string& prefix);

}  // namespace gpucloud
