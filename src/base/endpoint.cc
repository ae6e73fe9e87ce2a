#include "base/endpoint.h"

#include <cstdio>

namespace switchml {

std::string Ipv4ToString(uint32_t ip) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "%u.%u.%u.%u", ip >> 24, (ip >> 16) & 0xff, (ip >> 8) & 0xff,
                ip & 0xff);
  return buf;
}

std::string Endpoint::ToString() const { return Ipv4ToString(ipv4) + ":" + std::to_string(port); }

bool ParseIpv4(const std::string& text, uint32_t* out) {
  uint32_t result = 0;
  int parts = 0;
  size_t i = 0;
  while (parts < 4) {
    if (i >= text.size() || text[i] < '0' || text[i] > '9') return false;
    uint32_t v = 0;
    size_t digits = 0;
    while (i < text.size() && text[i] >= '0' && text[i] <= '9') {
      v = v * 10 + static_cast<uint32_t>(text[i] - '0');
      if (++digits > 3 || v > 255) return false;
      ++i;
    }
    result = (result << 8) | v;
    ++parts;
    if (parts < 4) {
      if (i >= text.size() || text[i] != '.') return false;
      ++i;
    }
  }
  if (i != text.size()) return false;
  *out = result;
  return true;
}

}  // namespace switchml
