// The Ethernet II / IPv4 / UDP frames of the transports that build and parse frames themselves
// (AF_XDP: xdp.cc; DPDK: dpdk.cc): one parser and one header writer, pure functions tested and
// fuzzed alone (frame_test.cc, fuzz/frame_fuzz.cc). No VLAN tags, no IPv4 options; fragments are
// never SwitchML's.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>

#include "base/endpoint.h"

namespace switchml::transport {

inline constexpr size_t kEthernetBytes = 14;
inline constexpr size_t kIpv4Bytes = 20;
inline constexpr size_t kUdpBytes = 8;
inline constexpr size_t kFrameHeaderBytes = kEthernetBytes + kIpv4Bytes + kUdpBytes;  // 42

using MacAddress = std::array<uint8_t, 6>;

// Ones' complement sum of `data` in memory order (RFC 1071), not folded; fold with ChecksumFold.
uint64_t ChecksumAdd(uint64_t sum, const uint8_t* data, size_t len);
// Folds a sum of ChecksumAdd into the 16-bit checksum, in memory order as stored in headers.
uint16_t ChecksumFold(uint64_t sum);

// What a receiver takes.
struct FrameFilter {
  uint32_t local_ipv4 = 0;  // the destination address to accept (host order); 0: any
  uint16_t local_port = 0;  // the destination UDP port to accept
  // Checks the caller has not had done by the device (DPDK's offload flags): the IPv4 header
  // checksum, and the UDP checksum when the sender set one (not 0) and the frame is whole.
  bool verify_ip_checksum = true;
  bool verify_udp_checksum = true;
};

enum class FrameVerdict : uint8_t {
  kUdp,          // a UDP datagram for us: the other fields are set
  kArp,          // an ARP packet (the caller may answer it)
  kOther,        // another EtherType
  kMalformed,    // too short, not IPv4 without options, not UDP, a fragment, lengths that lie
  kNotForUs,     // another destination address or port
  kBadChecksum,  // the IPv4 header's or the UDP checksum does not verify
};

struct ParsedFrame {
  FrameVerdict verdict = FrameVerdict::kMalformed;
  Endpoint source;
  uint32_t destination_ipv4 = 0;
  MacAddress source_mac{};
  // The UDP payload: its length by the UDP header, and the bytes of it the frame holds (fewer
  // when `frame` is the first part of a longer one: not whole).
  size_t payload_bytes = 0;
  std::span<const uint8_t> payload;
  bool whole = false;
};

// Parses `frame`, the frame's first `frame.size()` bytes (all of them, or a first segment) of
// `wire_length` in all. Reads nothing outside `frame`.
ParsedFrame ParseFrame(std::span<const uint8_t> frame, size_t wire_length,
                       const FrameFilter& filter);

// Writes the 42 bytes of headers in front of a payload of `payload_bytes` that follows them at
// out + 42 (read for the UDP checksum when `udp_checksum`; else the checksum is 0, "none"):
// IPv4 without options, don't fragment, TTL 64, identification `ip_id`.
void WriteFrameHeaders(uint8_t* out, const MacAddress& destination_mac,
                       const MacAddress& source_mac, const Endpoint& source,
                       const Endpoint& destination, size_t payload_bytes, uint16_t ip_id,
                       bool udp_checksum);

}  // namespace switchml::transport
