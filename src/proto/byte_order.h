// Big-endian 32-bit loads and stores: the wire's byte order, one element at a time. The vector
// forms are in byte_order-inl.h. Internal to the cores (proto, quant); not part of the codec API.
#pragma once

#include <cstdint>

namespace switchml::proto {

inline uint32_t LoadBe32(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}

inline void StoreBe32(uint32_t v, uint8_t* p) {
  p[0] = static_cast<uint8_t>(v >> 24);
  p[1] = static_cast<uint8_t>(v >> 16);
  p[2] = static_cast<uint8_t>(v >> 8);
  p[3] = static_cast<uint8_t>(v);
}

}  // namespace switchml::proto
