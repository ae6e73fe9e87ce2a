#include "transport/checksum.h"

#include <gtest/gtest.h>

#include <array>
#include <cstdint>
#include <random>

namespace switchml::transport {
namespace {

// RFC 1071's definition: the complemented ones' complement sum of the big-endian 16-bit words.
uint16_t Reference(const std::array<uint8_t, 20>& h) {
  uint32_t sum = 0;
  for (size_t i = 0; i < h.size(); i += 2) sum += (uint32_t{h[i]} << 8) | h[i + 1];
  while (sum > 0xffff) sum = (sum & 0xffff) + (sum >> 16);
  return static_cast<uint16_t>(~sum);
}

// The checksum field as Ipv4HeaderChecksum returns it (memory order), read big-endian.
uint16_t BigEndian(uint16_t memory_order) {
  const auto* b = reinterpret_cast<const uint8_t*>(&memory_order);
  return static_cast<uint16_t>((b[0] << 8) | b[1]);
}

// Given a textbook header (192.168.0.1 -> 192.168.0.199, UDP, 115 bytes), Expect 0xb861, and a
// header carrying its checksum to sum to 0.
TEST(Ipv4HeaderChecksumTest, KnownHeader) {
  std::array<uint8_t, 20> h = {0x45, 0x00, 0x00, 0x73, 0x00, 0x00, 0x40, 0x00, 0x40, 0x11,
                               0x00, 0x00, 0xc0, 0xa8, 0x00, 0x01, 0xc0, 0xa8, 0x00, 0xc7};
  const uint16_t c = Ipv4HeaderChecksum(h.data());
  EXPECT_EQ(BigEndian(c), 0xb861);
  std::memcpy(&h[10], &c, 2);
  EXPECT_EQ(Ipv4HeaderChecksum(h.data()), 0);
}

// Given random headers, all-zero and all-ones ones, Expect the RFC 1071 definition's result.
TEST(Ipv4HeaderChecksumTest, MatchesTheDefinition) {
  std::mt19937 rng(7);
  for (int i = 0; i < 100000; ++i) {
    std::array<uint8_t, 20> h;
    const int kind = i % 3;
    for (uint8_t& b : h) b = kind == 0 ? static_cast<uint8_t>(rng()) : kind == 1 ? 0xff : 0x00;
    if (kind != 0 && i > 3) continue;
    ASSERT_EQ(BigEndian(Ipv4HeaderChecksum(h.data())), Reference(h)) << i;
  }
}

}  // namespace
}  // namespace switchml::transport
