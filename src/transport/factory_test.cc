#include "transport/factory.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "transport/lossy.h"
#include "transport/memory.h"
#include "transport/shm.h"

namespace switchml::transport {
namespace {

using std::chrono::milliseconds;

TEST(TransportFactoryTest, UnknownKindIsRefusedNamingTheKnownOnes) {
  TransportOptions o;
  o.kind = "carrier-pigeon";
  auto t = OpenTransport(o);
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(t.status().message().find("carrier-pigeon"), std::string::npos);
  EXPECT_NE(t.status().message().find("udp-plain"), std::string::npos);
  o.kind = "udp";
  o.loss = 1.5;
  EXPECT_EQ(OpenTransport(o).status().code(), StatusCode::kInvalidArgument);
}

// Given the table, Expect one entry per kind name, each found by its name, and a name that is
// not in it found nowhere (no capability).
TEST(TransportFactoryTest, TheTableNamesEachKindOnce) {
  const std::vector<std::string> kinds = TransportKinds();
  ASSERT_EQ(kinds.size(), TransportTable().size());
  for (const std::string& kind : kinds) {
    const TransportKind* k = FindTransportKind(kind);
    ASSERT_NE(k, nullptr) << kind;
    EXPECT_EQ(k->name, kind);
    EXPECT_EQ(std::count(kinds.begin(), kinds.end(), kind), 1) << kind;
  }
  EXPECT_EQ(FindTransportKind("carrier-pigeon"), nullptr);
  const Capabilities none = CapabilitiesOf("carrier-pigeon");
  EXPECT_FALSE(none.host_multicast || none.host_local || none.lends_destination_memory ||
               none.files_outlive_processes || none.one_process_per_interface);
  // Kernel UDP with and without offloads differ in that alone.
  Capabilities udp = CapabilitiesOf("udp"), plain = CapabilitiesOf("udp-plain");
  EXPECT_TRUE(udp.segmentation_offloads);
  EXPECT_FALSE(plain.segmentation_offloads);
}

// Given every kind that opens on loopback without a peer process (xdp needs an interface of its
// own, dpdk's memif workers a switch: conformance_test.cc covers both), Expect consecutive ports,
// a datagram carried, and the capabilities the kind claims to hold: a received datagram's memory
// lent for a reply only where it says so, and groups of this host joined exactly where it has
// them.
TEST(TransportFactoryTest, EveryKindOpensConsecutivePortsAndCarriesADatagram) {
  for (const std::string& kind : TransportKinds()) {
    const Capabilities caps = CapabilitiesOf(kind);
    if (caps.one_process_per_interface || caps.lends_receive_buffers) continue;
    TransportOptions o;
    o.kind = kind;
    o.bind_ipv4 = kLoopbackIpv4;
    auto ts = OpenTransports(o, 3);
    ASSERT_TRUE(ts.ok()) << kind << ": " << ts.status().ToString();
    ASSERT_EQ(ts->size(), 3u);
    EXPECT_EQ((*ts)[2]->local_endpoint().port, (*ts)[0]->local_endpoint().port + 2);
    const uint8_t byte = 7;
    TxDatagram tx{(*ts)[1]->local_endpoint(), {&byte, 1}};
    ASSERT_EQ(*(*ts)[0]->Send({&tx, 1}), 1u);
    RxDatagram rx;
    ASSERT_EQ(*(*ts)[1]->Receive({&rx, 1}, std::chrono::seconds(10)), 1u) << kind;
    EXPECT_EQ(rx.data[0], 7);
    EXPECT_EQ(rx.source, (*ts)[0]->local_endpoint());
    EXPECT_TRUE(rx.reply_buffer.empty()) << kind;
    const Status joined = (*ts)[2]->JoinGroup(Endpoint{0xefc00001, 12345}, 0);
    if (caps.host_multicast) {
      EXPECT_TRUE(joined.ok()) << kind << ": " << joined.ToString();
    } else {
      EXPECT_EQ(joined.code(), StatusCode::kUnimplemented) << kind;
    }
    (*ts)[2]->LeaveGroup();
  }
}

// Given what a switch serves, Expect transport "auto" to pick kernel UDP for a kernel UDP switch
// (or one that does not say), to refuse xdp and dpdk naming the kind to set, and to pick shm
// exactly while a live shm transport holds the switch's data port in the shm directory the
// environment names: not before it opened, not in another directory, not after it closed.
TEST(TransportFactoryTest, AutoPicksWhatTheSwitchServesWhereThisHostCanOpenIt) {
  char tmpl[] = "/dev/shm/switchml-auto-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  const EnvironmentLookup env = [&](const char* name) -> std::optional<std::string> {
    if (std::string(name) == "SWITCHML_SHM_DIR") return dir;
    return std::nullopt;
  };
  for (const char* served : {"", "udp", "udp-plain"}) {
    Result<std::string> k = ChooseAutoTransport(served, 48864, env);
    ASSERT_TRUE(k.ok()) << served << ": " << k.status().ToString();
    EXPECT_EQ(*k, "udp") << served;
  }
  for (const char* served : {"xdp", "dpdk"}) {
    Result<std::string> k = ChooseAutoTransport(served, 48864, env);
    EXPECT_EQ(k.status().code(), StatusCode::kFailedPrecondition) << served;
    EXPECT_NE(k.status().message().find(std::string("set transport ") + served), std::string::npos)
        << k.status().message();
  }
  // No switch in the directory yet.
  Result<std::string> none = ChooseAutoTransport("shm", 23456, env);
  EXPECT_EQ(none.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(none.status().message().find(dir), std::string::npos) << none.status().message();
  {
    TransportOptions o;
    o.kind = "shm";
    o.port = 0;
    o.shm.directory = dir;
    auto t = OpenShmConsecutive(o, 1);
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    const uint16_t port = (*t)[0]->local_endpoint().port;
    Result<std::string> k = ChooseAutoTransport("shm", port, env);
    ASSERT_TRUE(k.ok()) << k.status().ToString();
    EXPECT_EQ(*k, "shm");
    EXPECT_FALSE(ChooseAutoTransport("shm", port + 1, env).ok()) << "another port";
    const EnvironmentLookup elsewhere = [](const char* name) -> std::optional<std::string> {
      if (std::string(name) == "SWITCHML_SHM_DIR") return "/dev/shm/switchml-auto-nowhere";
      return std::nullopt;
    };
    EXPECT_FALSE(ChooseAutoTransport("shm", port, elsewhere).ok()) << "another directory";
    t->clear();  // closed: its inbox is gone
    EXPECT_FALSE(ChooseAutoTransport("shm", port, env).ok()) << "closed";
  }
  ::rmdir(dir.c_str());
}

TEST(LossyTransportTest, DropsTheConfiguredFractionEachWayAndCountsIt) {
  MemoryNetwork net;
  const Endpoint ka{kLoopbackIpv4, 1000}, kb{kLoopbackIpv4, 2000};
  auto a = MakeLossy(net.Attach(ka), 0.2, 7);
  auto b = MakeLossy(net.Attach(kb), 0.2, 8);
  constexpr size_t kCount = 20000;
  std::vector<uint8_t> payload(4, 1);
  std::vector<TxDatagram> tx(kCount, TxDatagram{kb, payload});
  // Every datagram is taken, dropped or not.
  ASSERT_EQ(*a->Send(tx), kCount);
  std::vector<RxDatagram> rx(64);
  size_t received = 0;
  for (;;) {
    auto n = b->Receive(rx, milliseconds(0));
    ASSERT_TRUE(n.ok());
    if (*n == 0) break;
    received += *n;
  }
  const TransportCounters ca = a->counters(), cb = b->counters();
  EXPECT_NEAR(static_cast<double>(ca.loss_dropped_out) / kCount, 0.2, 0.02);
  EXPECT_EQ(cb.datagrams_received, kCount - ca.loss_dropped_out);
  EXPECT_NEAR(static_cast<double>(cb.loss_dropped_in) / cb.datagrams_received, 0.2, 0.02);
  EXPECT_EQ(received + cb.loss_dropped_in, cb.datagrams_received);
  EXPECT_EQ(a->name(), "lossy(memory)");
}

}  // namespace
}  // namespace switchml::transport
