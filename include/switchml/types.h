// Element types and small shared vocabulary of the public API.
#pragma once

#include <cstddef>
#include <string>

namespace switchml {

// Element types an all-reduce (SUM) supports. int32 sums exactly with 32-bit wrap-around;
// float32 is quantized to int32 per packet (block floating point), see docs/architecture.md.
enum class DataType { kInt32, kFloat32 };

inline size_t DataTypeSize(DataType) { return 4; }
inline const char* DataTypeName(DataType t) { return t == DataType::kInt32 ? "int32" : "float32"; }
inline bool ParseDataType(const std::string& s, DataType* out) {
  if (s == "int32") {
    *out = DataType::kInt32;
    return true;
  }
  if (s == "float32") {
    *out = DataType::kFloat32;
    return true;
  }
  return false;
}

}  // namespace switchml
