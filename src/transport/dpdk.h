// The DPDK backend: SwitchML datagrams in full Ethernet/IPv4/UDP frames that the transport builds
// and parses itself, moved by a DPDK poll-mode driver in bursts, bypassing the kernel.
//
// Options: TransportOptions::dpdk (options.h), which the factory fills from the SWITCHML_DPDK_*
// variables named below (environment.h: read there only, once per open).
//
// Devices (DpdkOptions::device: SWITCHML_DPDK_DEVICE, or the tools' --dpdk-device):
//   - "memif" (the default): shared memory between the processes of one host (net_memif). The
//     switch side (TransportOptions::switch_side) is the memif server: each data port P listens on
//     the abstract socket "<prefix>-P" with DpdkOptions::memif_interfaces interfaces (ids 0..n-1),
//     one per worker thread that may connect. A worker transport is a memif client: on its first
//     Send it connects to the socket of the destination's port with the lowest free id (free ids
//     are taken with flock on <prefix>-P.<id>.lock in this user's lock directory, released when the
//     process ends). Ports are reserved in the kernel (an unused UDP socket per port), so that
//     two processes of one host never claim the same one.
// Lock directory (doorbells and id locks): this user's own, /run/switchml-dpdk for root, else
// /tmp/switchml-dpdk-UID, or $SWITCHML_DPDK_LOCK_DIR; made 0700 and refused unless it is this
// user's and closed to others; files 0600, opened without following links (private_dir.h).
// The switch and its workers share doorbells and ids only when they run as one user.
//   - anything else: one DPDK port per process, by PCI address ("0000:01:00.0") or as a virtual
//     device ("net_af_packet0,iface=veth0", "net_af_xdp0,iface=veth0"), shared by the transports
//     of OpenDpdkConsecutive: transport t uses queue t (steered by an rte_flow rule on its UDP
//     port when there are several; a device without rte_flow then needs one thread).
//
// Frames: Ethernet II, IPv4 (no options, DF, TTL 64), UDP, as the reference's DPDK client sends
// them. IPv4 and UDP checksums are offloaded where the device offers it, else computed (over memif
// the UDP checksum is 0, "none": memory to memory); received checksums are checked unless the
// device already did. Neighbours: each transport answers ARP
// requests for its address, learns the MAC of every IPv4 source it receives from, takes static
// entries from SWITCHML_DPDK_NEIGH ("10.0.0.1=02:00:00:00:00:01,10.0.0.2=..."), and sends to the
// broadcast MAC while a destination is unknown.
//
// EAL: initialised once per process, on the first open, with the arguments of SWITCHML_DPDK_EAL
// (the tools' --dpdk-eal) or, by default, "--no-huge --no-pci --no-shconf -m 512
// --no-telemetry --log-level=pmd.net.memif:error --log-level=*:warning" (virtual devices only;
// see docs/dpdk.md for real NICs). The calling thread's CPU affinity is restored afterwards.
// Threads that use a transport register with EAL (rte_thread_register) on first use, for mempool
// caches.
//
// Waiting: Receive polls the device; while nothing arrives it sleeps, so that poll-mode processes
// share a small machine. Over memif until a peer's frame comes: each transport has a doorbell (a
// futex in a page shared with its peers, in the lock directory) that a sender rings after a
// Send only when the receiver announced that it sleeps (SWITCHML_DPDK_DOORBELL=off turns them
// off; sleeps are capped at SWITCHML_DPDK_MAX_SLEEP_US, 10 ms). Elsewhere in naps of 20 us to
// 1 ms. Wake() rings the doorbell. SWITCHML_DPDK_SPIN / _YIELD_US / _NAP_US / _MAX_NAP_US tune it;
// SWITCHML_DPDK_POLL=spin keeps spinning until the timeout. See docs/dpdk.md.
//
// Buffers: Receive lends the payloads inside the received mbufs (freed on the next Receive), also
// for a reply written over them (RxDatagram::reply_buffer: Send then hands that mbuf over);
// TxBuffer(i) lends the payload area of an mbuf that the transport holds, behind room for the
// headers, so Send writes only the headers and hands that mbuf to the driver (zero copy). A span
// from TxBuffer(i) is valid until the Send that carries it (call TxBuffer again for each batch,
// as transport.h says). A datagram of caller memory, or a second destination of the same buffer
// in one Send, is copied.
// Thread-safety: as Transport. Ownership: the transport owns its devices (closed on destruction).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "switchml/status.h"
#include "transport/options.h"
#include "transport/transport.h"

namespace switchml::transport {

// The longest datagram a DPDK transport carries: its mbufs' payload room
// (Capabilities::max_datagram_bytes).
inline constexpr size_t kDpdkMaxDatagramBytes = 2048;

// True when this build has DPDK (libdpdk-dev was found at configure time).
bool DpdkAvailable();

// Opens `count` DPDK transports on consecutive ports (one per thread). Errors say what failed:
// no DPDK in this build (kUnimplemented), EAL initialisation (its message, with the arguments),
// a missing device or driver, permissions (kFailedPrecondition / kPermissionDenied).
Result<std::vector<std::unique_ptr<Transport>>> OpenDpdkConsecutive(const TransportOptions& options,
                                                                    size_t count);

}  // namespace switchml::transport
