#include "runtime/packet_size.h"

#include <gtest/gtest.h>

#include <string>

#include "proto/wire.h"
#include "transport/auth.h"
#include "transport/factory.h"

namespace switchml::runtime {
namespace {

// The switch's default: the largest size each transport carries, with the tag's room.
TEST(LargestMaxPacketNumelTest, ByTransport) {
  EXPECT_EQ(LargestMaxPacketNumel("udp"), 2048u);
  EXPECT_EQ(LargestMaxPacketNumel("udp-plain"), 2048u);
  EXPECT_EQ(LargestMaxPacketNumel("shm"), 2048u);
  EXPECT_EQ(LargestMaxPacketNumel("xdp"), 256u);   // one 2 KiB UMEM frame
  EXPECT_EQ(LargestMaxPacketNumel("dpdk"), 256u);  // one mbuf
  // Every choice fits its transport, tag included.
  for (const std::string& kind : transport::TransportKinds()) {
    const size_t most = transport::CapabilitiesOf(kind).max_datagram_bytes;
    if (most == 0) continue;
    EXPECT_LE(proto::DatagramBytesForNumel(LargestMaxPacketNumel(kind)) + transport::kAuthRoomBytes,
              most)
        << kind;
  }
}

// One row of the choice table: the limits, the size chosen, and a word of the reason.
struct Row {
  PacketSizeLimits limits;
  uint32_t expected;
  const char* because;
};

PacketSizeLimits Limits(uint32_t switch_max, size_t transport_max, bool host_local, uint32_t mtu,
                        size_t extra = 0) {
  PacketSizeLimits l;
  l.switch_max = switch_max;
  l.transport_max_datagram = transport_max;
  l.host_local = host_local;
  l.mtu = mtu;
  l.extra_bytes = extra;
  return l;
}

TEST(ChooseAutoPacketNumelTest, Table) {
  const Row rows[] = {
      // shm on one host: only the switch bounds it.
      {Limits(2048, 0, true, 0), 2048, "largest"},
      {Limits(1024, 0, true, 0), 1024, "switch takes at most 1024"},
      {Limits(256, 0, true, 0), 256, "switch takes at most 256"},
      // A reference switch (or one that does not say): 256.
      {Limits(256, 0, false, 9000), 256, "switch takes at most 256"},
      // Kernel UDP: the MTU toward the switch. 8202 + 28 fits 9000; 4106 + 28 fits 4500.
      {Limits(2048, 0, false, 9000), 2048, "largest"},
      {Limits(2048, 0, false, 8229), 1024, "MTU toward the switch is 8229"},
      {Limits(2048, 0, false, 8230), 2048, "largest"},
      {Limits(2048, 0, false, 4500), 1024, "MTU toward the switch is 4500"},
      {Limits(2048, 0, false, 1500), 256, "MTU toward the switch is 1500"},
      {Limits(2048, 0, false, 65536), 2048, "largest"},  // the loopback interface
      // Unknown MTU off this host: what fits any Ethernet path.
      {Limits(2048, 0, false, 0), 256, "MTU toward the switch is unknown"},
      // The tag's room counts: 8202 + 12 + 28 > 8230.
      {Limits(2048, 0, false, 8230, transport::kAuthRoomBytes), 1024, "MTU"},
      // Transports of one frame per datagram.
      {Limits(2048, 1750, false, 9000), 256, "carries datagrams of at most 1750"},
      {Limits(2048, 2048, false, 9000), 256, "carries datagrams of at most 2048"},
      {Limits(2048, 4200, false, 9000), 1024, "carries datagrams of at most 4200"},
      // The smallest bound wins.
      {Limits(512, 0, false, 9000), 512, "switch takes at most 512"},
  };
  for (const Row& r : rows) {
    std::string why;
    EXPECT_EQ(ChooseAutoPacketNumel(r.limits, &why), r.expected)
        << "switch " << r.limits.switch_max << ", transport " << r.limits.transport_max_datagram
        << ", host_local " << r.limits.host_local << ", MTU " << r.limits.mtu;
    EXPECT_NE(why.find(r.because), std::string::npos) << why;
  }
}

}  // namespace
}  // namespace switchml::runtime
