// Fuzzes the frame codec of the raw transports (transport/frame.h: AF_XDP's and DPDK's receive
// path parse every frame a NIC or a memif peer hands them with it), two ways per input:
//   - arbitrary bytes as a frame (the whole of it, or a first segment of a longer one), with a
//     fuzzed filter: no read outside the bytes (ASan), and an accepted frame really is an
//     option-less IPv4 UDP datagram, not a fragment, for the filter's address and port, whose
//     checksums verify where the filter asks, with its payload inside the frame and of the
//     length its headers say;
//   - a frame written by WriteFrameHeaders from fuzzed addresses, ports and payload: parsed back
//     to the same datagram; and with any one bit of its IPv4 header, UDP header or payload
//     flipped, never accepted (both checksums verified) unless the flip cleared the UDP
//     checksum to 0 ("none").
#include <fuzzer/FuzzedDataProvider.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "fuzz_check.h"
#include "transport/frame.h"

namespace {

using namespace switchml;
using namespace switchml::transport;

uint16_t Be16(const uint8_t* p) { return static_cast<uint16_t>(p[0] << 8 | p[1]); }
uint32_t Be32(const uint8_t* p) {
  return uint32_t{p[0]} << 24 | uint32_t{p[1]} << 16 | uint32_t{p[2]} << 8 | p[3];
}

void CheckAccepted(const ParsedFrame& f, const std::vector<uint8_t>& frame,
                   const FrameFilter& filter) {
  if (f.verdict != FrameVerdict::kUdp) return;
  FUZZ_CHECK(frame.size() >= kFrameHeaderBytes);
  const uint8_t* ip = frame.data() + kEthernetBytes;
  const uint8_t* udp = ip + kIpv4Bytes;
  FUZZ_CHECK(Be16(frame.data() + 12) == 0x0800);
  FUZZ_CHECK(ip[0] == 0x45 && ip[9] == 17);
  FUZZ_CHECK((Be16(ip + 6) & 0x3fff) == 0);  // not a fragment
  if (filter.verify_ip_checksum) FUZZ_CHECK(ChecksumFold(ChecksumAdd(0, ip, kIpv4Bytes)) == 0);
  FUZZ_CHECK(Be16(udp + 2) == filter.local_port);
  FUZZ_CHECK(f.destination_ipv4 == Be32(ip + 16));
  if (filter.local_ipv4 != 0) FUZZ_CHECK(f.destination_ipv4 == filter.local_ipv4);
  FUZZ_CHECK(f.source.ipv4 == Be32(ip + 12) && f.source.port == Be16(udp));
  FUZZ_CHECK(f.payload_bytes + kUdpBytes == Be16(udp + 4));
  FUZZ_CHECK(f.payload_bytes + kUdpBytes + kIpv4Bytes <= Be16(ip + 2));
  FUZZ_CHECK(f.payload.data() == frame.data() + kFrameHeaderBytes);
  FUZZ_CHECK(f.payload.size() <= frame.size() - kFrameHeaderBytes);
  FUZZ_CHECK(f.payload.size() <= f.payload_bytes);
  FUZZ_CHECK(f.whole == (f.payload.size() == f.payload_bytes));
  FUZZ_CHECK(std::memcmp(f.source_mac.data(), frame.data() + 6, 6) == 0);
  if (filter.verify_udp_checksum && f.whole && Be16(udp + 6) != 0) {
    uint64_t sum = ChecksumAdd(0, ip + 12, 8);
    const uint8_t pseudo[4] = {0, 17, udp[4], udp[5]};
    sum = ChecksumAdd(sum, pseudo, 4);
    sum = ChecksumAdd(sum, udp, kUdpBytes + f.payload_bytes);
    FUZZ_CHECK(ChecksumFold(sum) == 0);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  // Arbitrary bytes.
  {
    FrameFilter filter;
    filter.local_ipv4 = in.ConsumeBool() ? 0 : in.ConsumeIntegral<uint32_t>();
    filter.local_port = in.ConsumeIntegral<uint16_t>();
    filter.verify_ip_checksum = in.ConsumeBool();
    filter.verify_udp_checksum = in.ConsumeBool();
    const size_t extra = in.ConsumeIntegralInRange<size_t>(0, 3000);
    std::vector<uint8_t> frame =
        in.ConsumeBytes<uint8_t>(in.ConsumeIntegralInRange<size_t>(0, 4096));
    const ParsedFrame f = ParseFrame(frame, frame.size() + extra, filter);
    CheckAccepted(f, frame, filter);
    if (extra == 0) FUZZ_CHECK(f.verdict != FrameVerdict::kUdp || f.whole);
  }
  // A written frame, parsed back, then with one bit flipped.
  {
    MacAddress dst_mac{}, src_mac{};
    for (auto& b : dst_mac) b = in.ConsumeIntegral<uint8_t>();
    for (auto& b : src_mac) b = in.ConsumeIntegral<uint8_t>();
    const Endpoint src{in.ConsumeIntegral<uint32_t>(), in.ConsumeIntegral<uint16_t>()};
    const Endpoint dst{in.ConsumeIntegral<uint32_t>(), in.ConsumeIntegral<uint16_t>()};
    const uint16_t ip_id = in.ConsumeIntegral<uint16_t>();
    const bool udp_checksum = in.ConsumeBool();
    const std::vector<uint8_t> payload =
        in.ConsumeBytes<uint8_t>(in.ConsumeIntegralInRange<size_t>(0, 2048));
    std::vector<uint8_t> frame(kFrameHeaderBytes + payload.size());
    if (!payload.empty())
      std::memcpy(frame.data() + kFrameHeaderBytes, payload.data(), payload.size());
    WriteFrameHeaders(frame.data(), dst_mac, src_mac, src, dst, payload.size(), ip_id,
                      udp_checksum);
    const FrameFilter filter{dst.ipv4, dst.port, true, true};
    const ParsedFrame f = ParseFrame(frame, frame.size(), filter);
    FUZZ_CHECK(f.verdict == FrameVerdict::kUdp);
    FUZZ_CHECK(f.whole && f.source == src && f.destination_ipv4 == dst.ipv4);
    FUZZ_CHECK(f.payload_bytes == payload.size() && f.source_mac == src_mac);
    FUZZ_CHECK(payload.empty() ||
               std::memcmp(f.payload.data(), payload.data(), payload.size()) == 0);
    CheckAccepted(f, frame, filter);
    if (frame.size() > kEthernetBytes) {
      const size_t bit =
          in.ConsumeIntegralInRange<size_t>(kEthernetBytes * 8, frame.size() * 8 - 1);
      frame[bit / 8] ^= static_cast<uint8_t>(1u << (bit % 8));
      const uint8_t* udp = frame.data() + kEthernetBytes + kIpv4Bytes;
      const bool checksum_cleared = Be16(udp + 6) == 0;
      const ParsedFrame g = ParseFrame(frame, frame.size(), filter);
      CheckAccepted(g, frame, filter);
      if (udp_checksum && !checksum_cleared) FUZZ_CHECK(g.verdict != FrameVerdict::kUdp);
      if (bit / 8 < kEthernetBytes + kIpv4Bytes) FUZZ_CHECK(g.verdict != FrameVerdict::kUdp);
    }
  }
  return 0;
}
