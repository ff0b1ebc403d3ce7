#include <gpucloud/runtime/dtype.hpp>
#include <gpucloud/runtime/error.hpp>

#include <cctype>

namespace gpucloud {

const char* dtype_name(DType t) noexcept {
  switch (t) {
    case DType::float32:
      return "float32";
    case DType::float64:
      return "float64";
    case DType::float16:
      return "float16";
    case DType::bfloat16:
      return "bfloat16";
    case DType::int32:
      return "int32";
    case DType::int64:
      return "int64";
    case DType::uint8:
      return "uint8";
    case DType::float8_e4m3:
      return "float8_e4m3";
    case DType::float8_e5m2:
      return "float8_e5m2";
  }
  return "unknown";
}

DType dtype_from_name(const std::string& name) {
  std::string n;
  for (char c : name) n += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  for (int i = 0; i < kDTypeCount; ++i) {
    const auto t = static_cast<DType>(i);
    if (n == dtype_name(t)) return t;
  }
  struct Alias {
    const char* name;
    DType type;
  };
  static constexpr Alias aliases[] = {
      {"fp32", DType::float32},     {"float", DType::float32},        {"fp64", DType::float64},
      {"double", DType::float64},   {"fp16", DType::float16},         {"half", DType::float16},
      {"bf16", DType::bfloat16},    {"fp8_e4m3", DType::float8_e4m3}, {"fp8_e5m2", DType::float8_e5m2},
      {"e4m3", DType::float8_e4m3}, {"e5m2", DType::float8_e5m2},
  };
  for (const auto& a : aliases) {
    if (n == a.name) return a.type;
  }
  GPUCLOUD_FAIL(InvalidArgument, "dtype_from_name", "name: unknown dtype '" + name + "'");
}

}  // namespace gpucloud
