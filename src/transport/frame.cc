#include "transport/frame.h"

#include <cstring>

namespace switchml::transport {
namespace {

uint16_t Be16(const uint8_t* p) { return static_cast<uint16_t>(p[0] << 8 | p[1]); }
uint32_t Be32(const uint8_t* p) {
  return uint32_t{p[0]} << 24 | uint32_t{p[1]} << 16 | uint32_t{p[2]} << 8 | p[3];
}
void PutBe16(uint8_t* p, uint16_t v) {
  p[0] = static_cast<uint8_t>(v >> 8);
  p[1] = static_cast<uint8_t>(v);
}
void PutBe32(uint8_t* p, uint32_t v) {
  PutBe16(p, static_cast<uint16_t>(v >> 16));
  PutBe16(p + 2, static_cast<uint16_t>(v));
}

// The UDP checksum's sum over the pseudo-header and the UDP header and payload (ip: the IPv4
// header, udp: the UDP header followed by udp_len - 8 payload bytes).
uint64_t UdpSum(const uint8_t* ip, const uint8_t* udp, size_t udp_len) {
  uint64_t sum = ChecksumAdd(0, ip + 12, 8);  // source and destination addresses
  const uint8_t pseudo[4] = {0, 17, static_cast<uint8_t>(udp_len >> 8),
                             static_cast<uint8_t>(udp_len)};
  sum = ChecksumAdd(sum, pseudo, 4);
  return ChecksumAdd(sum, udp, udp_len);
}

}  // namespace

uint64_t ChecksumAdd(uint64_t sum, const uint8_t* data, size_t len) {
  while (len >= 8) {
    uint64_t v;
    std::memcpy(&v, data, 8);
    // Sum 32-bit halves in memory order; the fold keeps that order (RFC 1071).
    sum += (v & 0xffffffffu) + (v >> 32);
    data += 8;
    len -= 8;
  }
  if (len >= 4) {
    uint32_t v;
    std::memcpy(&v, data, 4);
    sum += v;
    data += 4;
    len -= 4;
  }
  if (len >= 2) {
    uint16_t v;
    std::memcpy(&v, data, 2);
    sum += v;
    data += 2;
    len -= 2;
  }
  if (len == 1) {
    uint16_t v = 0;
    std::memcpy(&v, data, 1);
    sum += v;
  }
  return sum;
}

uint16_t ChecksumFold(uint64_t sum) {
  while (sum >> 16) sum = (sum & 0xffff) + (sum >> 16);
  return static_cast<uint16_t>(~sum & 0xffff);
}

ParsedFrame ParseFrame(std::span<const uint8_t> frame, size_t wire_length,
                       const FrameFilter& filter) {
  ParsedFrame out;
  if (frame.size() > wire_length || frame.size() < kEthernetBytes) return out;
  const uint8_t* eth = frame.data();
  const uint16_t type = Be16(eth + 12);
  if (type == 0x0806) {
    out.verdict = FrameVerdict::kArp;
    return out;
  }
  if (type != 0x0800) {
    out.verdict = FrameVerdict::kOther;
    return out;
  }
  if (frame.size() < kFrameHeaderBytes) return out;
  const uint8_t* ip = eth + kEthernetBytes;
  const uint8_t* udp = ip + kIpv4Bytes;
  // IPv4 without options, UDP, not a fragment (MF clear, offset 0): a later fragment's first
  // bytes would otherwise pass for a UDP header.
  if (ip[0] != 0x45 || ip[9] != 17 || (Be16(ip + 6) & 0x3fff) != 0) return out;
  const size_t total = Be16(ip + 2);
  const size_t udp_len = Be16(udp + 4);
  if (total < kIpv4Bytes + kUdpBytes || kEthernetBytes + total > wire_length ||
      udp_len < kUdpBytes || udp_len > total - kIpv4Bytes) {
    return out;
  }
  if (filter.verify_ip_checksum && ChecksumFold(ChecksumAdd(0, ip, kIpv4Bytes)) != 0) {
    out.verdict = FrameVerdict::kBadChecksum;
    return out;
  }
  out.destination_ipv4 = Be32(ip + 16);
  if ((filter.local_ipv4 != 0 && out.destination_ipv4 != filter.local_ipv4) ||
      Be16(udp + 2) != filter.local_port) {
    out.verdict = FrameVerdict::kNotForUs;
    return out;
  }
  out.whole = kFrameHeaderBytes + udp_len - kUdpBytes <= frame.size();
  if (filter.verify_udp_checksum && out.whole && Be16(udp + 6) != 0 &&
      ChecksumFold(UdpSum(ip, udp, udp_len)) != 0) {
    out.verdict = FrameVerdict::kBadChecksum;
    return out;
  }
  out.verdict = FrameVerdict::kUdp;
  out.source = Endpoint{Be32(ip + 12), Be16(udp)};
  std::memcpy(out.source_mac.data(), eth + 6, 6);
  out.payload_bytes = udp_len - kUdpBytes;
  const size_t held = frame.size() - kFrameHeaderBytes;
  out.payload =
      frame.subspan(kFrameHeaderBytes, out.payload_bytes < held ? out.payload_bytes : held);
  return out;
}

void WriteFrameHeaders(uint8_t* p, const MacAddress& destination_mac, const MacAddress& source_mac,
                       const Endpoint& source, const Endpoint& destination, size_t payload_bytes,
                       uint16_t ip_id, bool udp_checksum) {
  std::memcpy(p, destination_mac.data(), 6);
  std::memcpy(p + 6, source_mac.data(), 6);
  PutBe16(p + 12, 0x0800);
  uint8_t* ip = p + kEthernetBytes;
  ip[0] = 0x45;
  ip[1] = 0;
  PutBe16(ip + 2, static_cast<uint16_t>(kIpv4Bytes + kUdpBytes + payload_bytes));
  PutBe16(ip + 4, ip_id);
  PutBe16(ip + 6, 0x4000);  // don't fragment
  ip[8] = 64;               // TTL
  ip[9] = 17;               // UDP
  ip[10] = ip[11] = 0;
  PutBe32(ip + 12, source.ipv4);
  PutBe32(ip + 16, destination.ipv4);
  const uint16_t ip_sum = ChecksumFold(ChecksumAdd(0, ip, kIpv4Bytes));
  std::memcpy(ip + 10, &ip_sum, 2);
  uint8_t* udp = ip + kIpv4Bytes;
  const size_t udp_len = kUdpBytes + payload_bytes;
  PutBe16(udp, source.port);
  PutBe16(udp + 2, destination.port);
  PutBe16(udp + 4, static_cast<uint16_t>(udp_len));
  udp[6] = udp[7] = 0;
  if (udp_checksum) {
    uint16_t sum = ChecksumFold(UdpSum(ip, udp, udp_len));
    if (sum == 0) sum = 0xffff;  // 0 means "no checksum"
    std::memcpy(udp + 6, &sum, 2);
  }
}

}  // namespace switchml::transport
