// Internal: the alignment a pointer guarantees, for libraries whose algorithm choice depends on
// it (cuBLASLt assumes 256-byte-aligned matrices unless told otherwise) (not API).
#pragma once

#include <cstdint>

namespace gpucloud::detail {

/// The largest power of two, at most @p cap, that divides @p p's address (@p cap for null).
inline std::uint32_t pointer_alignment(const void* p, std::uint32_t cap = 256) {
  const auto address = reinterpret_cast<std::uintptr_t>(p);
  std::uint32_t a = 1;
  while (a < cap && (address & a) == 0) a <<= 1;
  return a;
}

}  // namespace gpucloud::detail
