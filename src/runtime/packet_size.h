// Which packet size (elements per packet) a switch and a worker use when the user leaves it to
// them (docs/protocol.md 2.6, "The automatic size"): the switch's default --max-packet-numel and
// a worker's packet_numel 0 (Config::packet_numel). Pure functions of what setup learned: the
// switch's largest size, the transport's longest datagram, the MTU toward the switch.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace switchml::runtime {

// The largest max_packet_numel (256, 512, 1024 or 2048) whose datagrams, with the authenticated
// data plane's room (transport::kAuthRoomBytes), transport kind `kind` carries: 2048 for udp,
// udp-plain and shm; 256 for xdp and dpdk (one frame or mbuf). `switchml switch`'s default.
uint32_t LargestMaxPacketNumel(std::string_view kind);

// What bounds a worker's automatic packet size.
struct PacketSizeLimits {
  // The smallest max_packet_numel of the job's switch hosts (256 for one that does not say: a
  // reference switch, or one of ours from before the field).
  uint32_t switch_max = 256;
  // The longest datagram the transport carries (transport::Capabilities; 0: any).
  size_t transport_max_datagram = 0;
  // Bytes behind each packet in a datagram (the authentication tag's room; 0 without).
  size_t extra_bytes = 0;
  // The transport never leaves this host (shm): no MTU applies.
  bool host_local = false;
  // The smallest MTU of the interfaces toward the switch hosts (0: unknown).
  uint32_t mtu = 0;
};

// The automatic packet size: the largest of 2048, 1024, 512 and 256 elements that the switch
// takes, the transport carries, and whose IP packet (datagram + 28 bytes) fits the MTU; with an
// unknown MTU on a transport that leaves the host, 256 (what fits any Ethernet path, as the
// reference). Never less than 256 (the reference's sizes are never refused). `why`, when not
// null, receives what bounded the choice, for the log and error messages.
uint32_t ChooseAutoPacketNumel(const PacketSizeLimits& limits, std::string* why = nullptr);

}  // namespace switchml::runtime
