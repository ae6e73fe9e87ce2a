// The AF_XDP backend ("xdp"): kernel-bypass datagrams through AF_XDP sockets (libxdp's xsk API
// on libbpf), for the switch and the workers, on veth pairs or real NICs, without DPDK.
//
// What it does:
//   - The interface is the one that owns the bind address (with bind 0.0.0.0: the host's only
//     non-loopback interface that is up with an IPv4 address; XdpOptions::interface names one).
//   - An XDP program (xdp_steer.bpf.c, compiled with clang -target bpf at build time and
//     embedded) is attached to it: IPv4/UDP datagrams to the transports' ports go to their AF_XDP
//     sockets (XSKMAP redirect); everything else (ARP, gRPC, other traffic) goes on to the
//     kernel. Native (driver) mode where the driver has it, else generic (skb) mode.
//   - Each transport is one AF_XDP socket on queue 0 (XdpOptions::queue); the transports of a
//     process on one interface share one UMEM (packet memory) and its fill and completion rings
//     (under a mutex); each has its own RX and TX rings. Zero-copy where the driver allows it,
//     else copy mode (veth, generic XDP). need_wakeup is used: an idle Receive sleeps in poll(),
//     it does not spin.
//   - Frames are full Ethernet/IPv4/UDP, built and parsed here: the IPv4 header checksum and the
//     UDP checksum are computed on send; on receive the IPv4 header checksum is checked, the UDP
//     checksum is not (senders with checksum offload leave it partial on veth). Neighbours' MAC
//     addresses come from the kernel's neighbour table (/proc/net/arp; a missing entry is
//     resolved by sending the kernel's ARP through a UDP probe to the discard port, waiting up to
//     a second), the next hop from the routing table (/proc/net/route); a destination that is an
//     address of this host gets the MAC of the interface that owns it.
//   - Each port is also bound by a kernel UDP socket, which reserves it (no other program gets
//     it) and receives whatever the XDP program passes on (e.g. IP fragments), dropped.
//   - Receive lends views into the UMEM frames (returned to the fill ring on the next Receive);
//     TxBuffer(i) lends a UMEM frame whose payload is sent in place (the headers are written in
//     front of it); a datagram in other memory, or a second destination of one buffer, is
//     copied into a free frame.
// Options: TransportOptions::xdp (options.h): interface, queue, attach mode, copy mode only,
// libbpf's warnings, lock directory; the factory fills them from SWITCHML_XDP_IFACE, _QUEUE,
// _MODE (native|generic|auto), _COPY, _DEBUG (0|1) and _LOCK_DIR (environment.h).
// max_datagram_bytes is capped at what one UMEM frame holds (2006 bytes).
// Needs CAP_NET_ADMIN, CAP_NET_RAW, CAP_BPF (root); errors say what is missing. One switchml
// process per interface, whatever its queue (the XDP program is the interface's): a second one,
// or this process on a second queue, is refused with a clear error (a lock file per network
// namespace and interface in this user's lock directory, held while the interface is used:
// /run/switchml-xdp for root, else /tmp/switchml-xdp-UID, or XdpOptions::lock_dir; made 0700,
// files 0600, as private_dir.h says; processes of different users do not see each other's lock).
// Thread-safety: as Transport. Compiled only where libxdp and libbpf were found at configure
// time (XdpAvailable()).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "switchml/status.h"
#include "transport/options.h"
#include "transport/transport.h"

namespace switchml::transport {

// The longest datagram an AF_XDP transport carries: one 2 KiB UMEM frame less the kernel's
// 256-byte headroom and the Ethernet, IPv4 and UDP headers (Capabilities::max_datagram_bytes).
inline constexpr size_t kXdpMaxDatagramBytes = 2048 - 256 - 42;

// False when the build has no AF_XDP support (libxdp-dev/libbpf-dev missing at configure time).
bool XdpAvailable();

// Opens `count` AF_XDP transports on consecutive ports from base.port (0: a random free base in
// [20000, 32000)), sharing one UMEM on the interface. Errors say why AF_XDP cannot start:
// permissions, no such interface, the kernel or driver refusing (with the errno text), a queue
// in use by another process.
Result<std::vector<std::unique_ptr<Transport>>> OpenXdpConsecutive(const TransportOptions& base,
                                                                   size_t count);

}  // namespace switchml::transport
