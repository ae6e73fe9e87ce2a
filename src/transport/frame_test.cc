// The raw transports' frame codec (frame.h): what it writes it parses back, and what it refuses.
#include "transport/frame.h"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

namespace switchml::transport {
namespace {

constexpr MacAddress kDstMac = {2, 0, 0, 0, 0, 1}, kSrcMac = {2, 0, 0, 0, 0, 2};
const Endpoint kSrc{0x0a000002, 40000}, kDst{0x0a000001, 48864};

std::vector<uint8_t> Frame(size_t payload, bool udp_checksum = true) {
  std::vector<uint8_t> f(kFrameHeaderBytes + payload);
  for (size_t i = 0; i < payload; ++i) f[kFrameHeaderBytes + i] = static_cast<uint8_t>(i * 7);
  WriteFrameHeaders(f.data(), kDstMac, kSrcMac, kSrc, kDst, payload, 9, udp_checksum);
  return f;
}

FrameFilter ForUs() { return FrameFilter{kDst.ipv4, kDst.port, true, true}; }

TEST(FrameTest, WrittenFramesParseBack) {
  for (size_t payload : {0, 1, 7, 1034}) {
    for (bool sum : {true, false}) {
      const auto f = Frame(payload, sum);
      const ParsedFrame p = ParseFrame(f, f.size(), ForUs());
      ASSERT_EQ(p.verdict, FrameVerdict::kUdp) << payload;
      EXPECT_EQ(p.source, kSrc);
      EXPECT_EQ(p.destination_ipv4, kDst.ipv4);
      EXPECT_EQ(p.source_mac, kSrcMac);
      EXPECT_EQ(p.payload_bytes, payload);
      EXPECT_TRUE(p.whole);
      ASSERT_EQ(p.payload.size(), payload);
      EXPECT_EQ(p.payload.data(), f.data() + kFrameHeaderBytes);
    }
  }
}

// The first segment of a longer frame: its payload is only partly there, and not checked.
TEST(FrameTest, AFirstSegmentIsNotWhole) {
  const auto f = Frame(1000);
  const ParsedFrame p = ParseFrame(std::span(f).first(600), f.size(), ForUs());
  ASSERT_EQ(p.verdict, FrameVerdict::kUdp);
  EXPECT_FALSE(p.whole);
  EXPECT_EQ(p.payload_bytes, 1000u);
  EXPECT_EQ(p.payload.size(), 600 - kFrameHeaderBytes);
  // Longer than the wire says: refused.
  EXPECT_EQ(ParseFrame(f, f.size() - 1, ForUs()).verdict, FrameVerdict::kMalformed);
}

TEST(FrameTest, RefusedFrames) {
  auto f = Frame(100);
  auto verdict = [&](const std::vector<uint8_t>& g, FrameFilter filter = ForUs()) {
    return ParseFrame(g, g.size(), filter).verdict;
  };
  // Another destination or port.
  EXPECT_EQ(verdict(f, FrameFilter{kDst.ipv4 + 1, kDst.port, true, true}), FrameVerdict::kNotForUs);
  EXPECT_EQ(verdict(f, FrameFilter{0, kDst.port, true, true}), FrameVerdict::kUdp);  // any address
  EXPECT_EQ(verdict(f, FrameFilter{kDst.ipv4, 1, true, true}), FrameVerdict::kNotForUs);
  // A flipped payload bit: the UDP checksum catches it (unless asked not to check).
  auto g = f;
  g[kFrameHeaderBytes + 5] ^= 0x10;
  EXPECT_EQ(verdict(g), FrameVerdict::kBadChecksum);
  EXPECT_EQ(verdict(g, FrameFilter{kDst.ipv4, kDst.port, true, false}), FrameVerdict::kUdp);
  // A flipped header bit: the IPv4 checksum.
  g = f;
  g[kEthernetBytes + 8] ^= 1;  // TTL
  EXPECT_EQ(verdict(g), FrameVerdict::kBadChecksum);
  // ARP, another EtherType, too short.
  g = f;
  g[12] = 0x08, g[13] = 0x06;
  EXPECT_EQ(verdict(g), FrameVerdict::kArp);
  g[13] = 0xdd;
  EXPECT_EQ(verdict(g), FrameVerdict::kOther);
  EXPECT_EQ(verdict(std::vector<uint8_t>(f.begin(), f.begin() + 41)), FrameVerdict::kMalformed);
  // IPv4 options, not UDP.
  g = f;
  g[kEthernetBytes] = 0x46;
  EXPECT_EQ(verdict(g), FrameVerdict::kMalformed);
  g = f;
  g[kEthernetBytes + 9] = 6;
  EXPECT_EQ(verdict(g), FrameVerdict::kMalformed);
  // A UDP length past the IPv4 datagram, or an IPv4 length past the frame.
  g = f;
  g[kEthernetBytes + kIpv4Bytes + 4] = 0x10;
  EXPECT_EQ(verdict(g), FrameVerdict::kMalformed);
  g = f;
  g[kEthernetBytes + 2] = 0x10;
  EXPECT_EQ(verdict(g), FrameVerdict::kMalformed);
}

// A later fragment of a datagram whose first bytes look like a UDP header for us was taken as
// one by the AF_XDP transport (it checked no fragment bits); both transports refuse it now.
TEST(FrameTest, FragmentsAreRefused) {
  for (uint16_t flags : {0x2000 /* more fragments */, 0x0001 /* offset 8 */, 0x2001}) {
    auto f = Frame(100, /*udp_checksum=*/false);
    uint8_t* ip = f.data() + kEthernetBytes;
    ip[6] = static_cast<uint8_t>(flags >> 8);
    ip[7] = static_cast<uint8_t>(flags);
    ip[10] = ip[11] = 0;
    const uint16_t sum = ChecksumFold(ChecksumAdd(0, ip, kIpv4Bytes));
    std::memcpy(ip + 10, &sum, 2);
    EXPECT_EQ(ParseFrame(f, f.size(), ForUs()).verdict, FrameVerdict::kMalformed) << flags;
  }
}

}  // namespace
}  // namespace switchml::transport
