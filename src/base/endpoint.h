// Endpoint: an IPv4 address and UDP port, both in host byte order. A plain value.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

namespace switchml {

struct Endpoint {
  uint32_t ipv4 = 0;  // host order: 127.0.0.1 is 0x7f000001
  uint16_t port = 0;
  bool operator==(const Endpoint&) const = default;
  // "127.0.0.1:48864"
  std::string ToString() const;
};

// "a.b.c.d" in host order; false when text is not a dotted quad.
bool ParseIpv4(const std::string& text, uint32_t* out);
std::string Ipv4ToString(uint32_t ipv4);

inline constexpr uint32_t kLoopbackIpv4 = 0x7f000001;

}  // namespace switchml

template <>
struct std::hash<switchml::Endpoint> {
  size_t operator()(const switchml::Endpoint& e) const {
    return std::hash<uint64_t>()((uint64_t{e.ipv4} << 16) | e.port);
  }
};
