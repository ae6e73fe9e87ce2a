// switchml_transport_bench: packet rates of the software switch over any transport, against a
// do-nothing DPDK forwarder on the same memif setup (bench/transport_bench.py runs them).
//
//   gen --kind K --data HOST:PORT [--control HOST:PORT] [--bind IP] --window W --seconds S
//       One worker thread's load: W packets of 256 int32 in flight, each reply answered by the next
//       packet on its slot (the other set), as a 1-worker job (registered at --control, when
//       given; a forwarder echoes the packet, which is a valid 1-worker result). Prints
//       "measuring" when the measured interval starts (after 0.5 s of warm-up), then
//       "pps=... elements_per_s=... gen_cpu=..." (gen_cpu: the process's CPU time from getrusage
//       over the measured interval, divided by its wall time).
//   fwd --port P   (DPDK only) a memif server (socket switchml-memif-P, ids 0..7) that sends
//       every frame back with addresses and ports swapped, polling without pause.
#include <sched.h>
#include <sys/resource.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "base/endpoint.h"
#include "control/control_client.h"
#include "flags.h"
#include "proto/wire.h"
#include "transport/address.h"
#include "transport/factory.h"

#ifdef SWITCHML_HAVE_DPDK
#include <rte_dev.h>
#include <rte_eal.h>
#include <rte_ethdev.h>
#include <rte_ether.h>
#include <rte_ip.h>
#include <rte_mbuf.h>
#include <rte_udp.h>
#endif

namespace {

using namespace switchml;
using switchml::tools::Flags;
using Clock = std::chrono::steady_clock;

double CpuSeconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_utime.tv_sec + u.ru_stime.tv_sec + 1e-6 * (u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

// Parses the flags of `role` (argv[2..argc)) into the variables bound to `flags`. Returns -1 to
// go on, else the exit code: 0 after --help, 2 after saying what is wrong.
int ParseRoleFlags(const char* role, Flags* flags, int argc, char** argv) {
  bool help = false;
  const Status st = flags->Parse(std::vector<std::string>(argv + 2, argv + argc), &help);
  if (help) {
    std::fputs(flags->Usage().c_str(), stdout);
    return 0;
  }
  if (!st.ok()) {
    std::fprintf(stderr, "%s: %s\n", role, st.message().c_str());
    return 2;
  }
  return -1;
}

int Gen(int argc, char** argv) {
  std::string kind = "udp", data_text = "127.0.0.1:48864", bind_text = "127.0.0.1", control;
  int64_t window = 256;
  double seconds = 3;
  Flags flags("gen",
              "One worker thread's load on a switch (or forwarder) at --data: --window packets in "
              "flight.",
              "switchml_transport_bench");
  flags.Add("kind", &kind, "the transport");
  flags.Add("data", &data_text, "the switch's data plane, HOST:PORT");
  flags.Add("control", &control, "the switch's control plane, HOST:PORT (none: a forwarder)");
  flags.Add("bind", &bind_text, "local IPv4 address");
  flags.Add("window", &window, "packets in flight, 1..16384");
  flags.Add("seconds", &seconds, "measured seconds");
  if (int code = ParseRoleFlags("gen", &flags, argc, argv); code >= 0) return code;
  if (window < 1 || window > 16384 || !(seconds > 0)) {
    std::fprintf(stderr, "gen: --window must be in 1..16384 and --seconds above 0\n");
    return 2;
  }
  auto data = transport::ParseHostPort(data_text, 48864);
  if (!data.ok()) {
    std::fprintf(stderr, "gen: %s\n", data.status().ToString().c_str());
    return 2;
  }
  uint32_t bind = kLoopbackIpv4;
  if (!ParseIpv4(bind_text, &bind)) {
    std::fprintf(stderr, "gen: --bind %s is not an IPv4 address\n", bind_text.c_str());
    return 2;
  }
  transport::TransportOptions o;
  o.kind = kind;
  o.bind_ipv4 = bind;
  o.max_datagram_bytes = proto::kReferenceMaxDatagramBytes;
  auto t = transport::OpenTransport(o);
  if (!t.ok()) {
    std::fprintf(stderr, "gen: %s\n", t.status().ToString().c_str());
    return 2;
  }
  transport::Transport& tr = **t;
  Endpoint dst = *data;
  uint8_t job = 0;
  if (!control.empty()) {
    control::ControlClient c(control, std::chrono::seconds(10));
    control::UdpSessionArgs a;
    a.job_id = std::random_device{}() | 1;
    a.num_workers = 1;
    a.ipv4 = bind;
    a.udp_port = tr.local_endpoint().port;
    a.max_outstanding_packets = static_cast<uint32_t>(window);
    a.size = proto::SizeCode::k1024B;
    auto r = c.UdpSession(a);
    if (!r.ok()) {
      std::fprintf(stderr, "gen: session: %s\n", r.status().ToString().c_str());
      return 2;
    }
    dst.port = r->data_port;
    job = static_cast<uint8_t>(a.job_id);
  }
  std::vector<int32_t> values(proto::kReferenceMaxNumel, 1);
  std::vector<uint32_t> tsi(window);
  std::vector<uint8_t> set(window, 0);
  std::vector<transport::TxDatagram> tx(window);
  auto build = [&](size_t i, uint32_t slot) {
    std::span<uint8_t> buf = tr.TxBuffer(i);
    proto::Header h;
    h.size = proto::SizeCode::k1024B;
    h.job_number = job;
    h.tsi = tsi[slot];
    h.slot = {static_cast<uint16_t>(slot), set[slot]};
    const size_t len = proto::Encode(h, values, buf);
    tx[i] = {dst, buf.first(len)};
  };
  auto send = [&](size_t n) {
    size_t done = 0;
    for (int k = 0; done < n && k < 100000; ++k) {
      auto r = tr.Send(std::span(tx).subspan(done, n - done));
      if (!r.ok()) {
        std::fprintf(stderr, "gen: send: %s\n", r.status().ToString().c_str());
        std::exit(1);
      }
      done += *r;
    }
  };
  for (uint32_t s = 0; s < window; ++s) {
    tsi[s] = s;
    build(s, s);
  }
  send(window);
  std::vector<transport::RxDatagram> rx(256);
  uint64_t replies = 0, counted = 0;
  const auto start = Clock::now();
  const auto warm = start + std::chrono::milliseconds(500);
  const auto end =
      warm + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
  auto last_reply = Clock::now();
  bool measuring = false;
  double cpu0 = 0;
  Clock::time_point t0;
  while (true) {
    const auto now = Clock::now();
    if (!measuring && now >= warm) {
      measuring = true;
      counted = 0;
      cpu0 = CpuSeconds();
      t0 = now;
      std::printf("measuring\n");  // the harness samples the server's CPU now and at "pps="
      std::fflush(stdout);
    }
    if (now >= end) break;
    auto r = tr.Receive(rx, std::chrono::milliseconds(0));
    if (!r.ok()) return 1;
    size_t n = 0;
    for (size_t i = 0; i < *r; ++i) {
      proto::Header h;
      if (proto::DecodeHeader(rx[i].data, &h) != proto::DecodeError::kOk) continue;
      const uint32_t s = h.slot.index;
      if (s >= window || h.tsi != tsi[s]) continue;  // a late duplicate
      tsi[s] += window;
      set[s] ^= 1;
      build(n++, s);
    }
    replies += n;
    counted += n;
    if (n > 0) {
      send(n);
      last_reply = now;
    } else if (now - last_reply > std::chrono::milliseconds(20)) {
      for (uint32_t s = 0; s < window; ++s) build(s, s);  // a loss stalled a slot: resend all
      send(window);
      last_reply = now;
    }
  }
  const double wall = std::chrono::duration<double>(Clock::now() - t0).count();
  const double pps = counted / wall;
  std::printf("pps=%.0f elements_per_s=%.4g gen_cpu=%.2f replies=%llu transport=%s\n", pps,
              pps * proto::kReferenceMaxNumel, (CpuSeconds() - cpu0) / wall,
              static_cast<unsigned long long>(replies), tr.name().c_str());
  return 0;
}

int Fwd(int argc, char** argv) {
#ifndef SWITCHML_HAVE_DPDK
  std::fprintf(stderr, "fwd: this build has no DPDK\n");
  return 2;
#else
  int64_t port_number = 48864;
  double seconds = 10;
  Flags flags("fwd", "A memif server that sends every frame back with addresses and ports swapped.",
              "switchml_transport_bench");
  flags.Add("port", &port_number, "names the memif socket, switchml-memif-PORT");
  flags.Add("seconds", &seconds, "how long to forward");
  if (int code = ParseRoleFlags("fwd", &flags, argc, argv); code >= 0) return code;
  const std::string port = std::to_string(port_number);
  std::vector<std::string> words = {"fwd", "--no-huge", "--no-pci",       "--no-shconf",
                                    "-m",  "256",       "--no-telemetry", "--log-level=*:error"};
  std::vector<char*> eargv;
  for (auto& w : words) eargv.push_back(w.data());
  cpu_set_t saved;
  sched_getaffinity(0, sizeof(saved), &saved);
  const int eal = rte_eal_init(static_cast<int>(eargv.size()), eargv.data());
  sched_setaffinity(0, sizeof(saved), &saved);  // not pinned: share the machine like the switch
  if (eal < 0) {
    std::fprintf(stderr, "fwd: EAL init failed\n");
    return 2;
  }
  // The mbufs and memif buffers of the DPDK transport (dpdk.cc): 2112 bytes of frame room.
  rte_mempool* pool =
      rte_pktmbuf_pool_create("fwd", 16383, 256, 0, RTE_PKTMBUF_HEADROOM + 2112, rte_socket_id());
  std::vector<uint16_t> ports;
  for (int id = 0; id < 8; ++id) {
    const std::string name = "net_memif_f" + std::to_string(id);
    const std::string args = "role=server,id=" + std::to_string(id) + ",socket=switchml-memif-" +
                             port + ",socket-abstract=yes,bsize=2112";
    if (rte_eal_hotplug_add("vdev", name.c_str(), args.c_str()) != 0) return 2;
    uint16_t p;
    rte_eth_dev_get_port_by_name(name.c_str(), &p);
    rte_eth_conf conf{};
    rte_eth_dev_configure(p, 1, 1, &conf);
    rte_eth_rx_queue_setup(p, 0, 1024, rte_socket_id(), nullptr, pool);
    rte_eth_tx_queue_setup(p, 0, 1024, rte_socket_id(), nullptr);
    rte_eth_dev_start(p);
    ports.push_back(p);
  }
  std::printf("fwd: ready\n");
  std::fflush(stdout);
  const auto end = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                      std::chrono::duration<double>(seconds));
  uint64_t frames = 0;
  rte_mbuf* m[32];
  while (Clock::now() < end) {
    for (int k = 0; k < 1000; ++k) {
      for (uint16_t p : ports) {
        const uint16_t n = rte_eth_rx_burst(p, 0, m, 32);
        for (uint16_t i = 0; i < n; ++i) {
          auto* eth = rte_pktmbuf_mtod(m[i], rte_ether_hdr*);
          std::swap(eth->src_addr, eth->dst_addr);
          auto* ip = reinterpret_cast<rte_ipv4_hdr*>(eth + 1);
          const uint32_t a = ip->src_addr;
          ip->src_addr = ip->dst_addr;
          ip->dst_addr = a;
          auto* udp = reinterpret_cast<rte_udp_hdr*>(ip + 1);
          const uint16_t u = udp->src_port;
          udp->src_port = udp->dst_port;
          udp->dst_port = u;
        }
        const uint16_t s = rte_eth_tx_burst(p, 0, m, n);
        for (uint16_t i = s; i < n; ++i) rte_pktmbuf_free(m[i]);
        frames += s;
      }
    }
  }
  std::printf("fwd: forwarded %llu\n", static_cast<unsigned long long>(frames));
  return 0;
#endif
}

}  // namespace

int main(int argc, char** argv) {
  const std::string role = argc > 1 ? argv[1] : "";
  if (role == "gen") return Gen(argc, argv);
  if (role == "fwd") return Fwd(argc, argv);
  std::fprintf(stderr, "usage: switchml_transport_bench gen|fwd [options] (see the source)\n");
  return 2;
}
