// Config: everything a worker process needs to join a SwitchML job. A plain struct with
// defaults; tools fill it from flags. The library reads no SWITCHML_* variable for what this
// struct holds; only the raw transports read their own device settings from the environment
// (SWITCHML_XDP_*, SWITCHML_DPDK_*, SWITCHML_SHM_DIR; docs/architecture.md, "Transports").
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "switchml/export.h"
#include "switchml/retransmit.h"
#include "switchml/status.h"
#include "switchml/wait.h"

namespace switchml {

struct SWITCHML_EXPORT Config {
  // This worker's rank in [0, num_workers) and the job's number of workers.
  uint32_t rank = 0;
  uint32_t num_workers = 1;
  // The switch's control plane (gRPC); its data port comes back from the session setup.
  std::string switch_host = "127.0.0.1";
  uint16_t control_port = 50099;
  // Striping (ours, beyond the reference; docs/deployment.md): the job's switch hosts, each
  // "host" or "host:port" (port: control_port), in place of switch_host. The job runs on every
  // host listed, each aggregating its own range of every worker thread's slots
  // (docs/architecture.md, "Striping over several switches"), so that k switches on servers,
  // each behind one link, carry a tensor's worth each instead of one carrying all n. When a host
  // dies the workers move its share to the others and the all-reduce under way completes
  // (docs/protocol.md, "Failover"). Every worker must list the same hosts in the same order;
  // each worker thread's window needs a slot per host. Empty: switch_host alone.
  std::vector<std::string> switch_hosts;
  static constexpr size_t kMaxSwitchHosts = 64;
  // The job's identity on the switch; every worker of a job must use the same one and
  // concurrent jobs must differ. 0: rank 0 picks one and broadcasts it (the reference's way,
  // fine for one job at a time).
  uint64_t session_id = 0;
  // Worker threads, each with its own UDP port, slots and window; every worker of a job must
  // use the same value. 0: automatic, as many as the switch's data-plane threads (asked at setup
  // through its status, as transport "auto"; the least common multiple over several switch
  // hosts, at most kMaxAutoThreads; 1 from a switch that does not say, as a reference switch):
  // Context::config() then holds the number chosen. The PyTorch backend's default.
  uint32_t num_worker_threads = 1;
  static constexpr uint32_t kMaxAutoThreads = 64;
  // Packets in flight per worker (all threads together) = slots used on the switch; every
  // worker of a job must use the same value. 0: from the bandwidth-delay product of link_gbps
  // and base_rtt, at least kMinShmAutoWindow over shm (OutstandingPackets(),
  // docs/architecture.md 4.5), the same on every worker given the same fields.
  uint32_t max_outstanding_packets = 0;
  // What the automatic window is sized for: the worker's link rate (Gbit/s) and the round-trip
  // time through the switch with empty queues.
  double link_gbps = 10;
  std::chrono::microseconds base_rtt{100};
  // The automatic window's rule: kWindowSafety times the bandwidth-delay product in packets
  // (datagram + kIpUdpHeaderBytes + kEthernetFrameBytes on the wire), rounded up to a multiple
  // of 32 and of num_worker_threads, within [kMinAutoWindow, kMaxAutoWindow] (the reference
  // switch's pool, and the software switch's default).
  static constexpr double kWindowSafety = 2;
  static constexpr uint32_t kIpUdpHeaderBytes = 28;
  static constexpr uint32_t kEthernetFrameBytes = 38;  // header, FCS, preamble, gap
  // Two of a worker thread's 32-packet send batches.
  static constexpr uint32_t kMinAutoWindow = 64;
  static constexpr uint32_t kMaxAutoWindow = 8192;
  // The automatic window's floor over shared memory (transport "shm"): on one host the round
  // trip is set by the scheduler, which runs the switch and every worker on the same cores, not
  // by a path; a window that covers a few time slices keeps the pipeline full (measured against
  // 256 in docs/architecture.md 4.5).
  static constexpr uint32_t kMinShmAutoWindow = 1024;
  // Elements per packet: 64 or 256 (the reference's sizes), or 512, 1024 or 2048 (jumbo packets,
  // our extension: only where the switch enables them, `switchml switch --max-packet-numel`, over
  // a transport that carries them (udp, udp-plain, shm) and an MTU toward the switch that holds
  // the datagram plus 28 bytes; setup refuses otherwise, saying what to fix: docs/protocol.md 2.6).
  // 0 (ours): automatic, chosen at setup: the largest of 2048, 1024, 512 and 256 that every
  // switch host takes (asked through Monitor.Status; 256 from a switch that does not say), the
  // transport carries and, off this host, the MTU of the interface toward the switch holds (256
  // where it is unknown); every worker takes rank 0's choice (through the rendezvous), and one
  // that cannot fails setup saying why. Context::config() then names the size chosen. The
  // default stays 256 (the reference's; no extra call).
  uint32_t packet_numel = 256;
  static constexpr uint32_t kAutoPacketNumel = 0;
  // Local IPv4 address to bind ("0.0.0.0": any) and first UDP port (0: pick free ones).
  std::string bind_address = "0.0.0.0";
  uint16_t udp_port = 0;
  // The data-plane transport: "udp" (kernel UDP with segmentation offloads, GSO and GRO, where
  // the kernel has them), "udp-plain" (kernel UDP without them), "xdp" (AF_XDP on the
  // interface of bind_address, or the only one; needs root), "dpdk", or "shm" (shared-memory
  // rings to a switch on this host); see docs/architecture.md. Or "auto" (ours): at setup the
  // worker asks the switch which transport it serves (Monitor.Status) and opens it: udp for a
  // kernel UDP switch, shm for a shm switch on this host (its inbox in this process's shm
  // directory); a switch that does not answer (a reference switch) counts as udp; one that
  // serves xdp or dpdk, or shm elsewhere, fails setup saying what to set. Context::config()
  // then names the transport chosen. The default stays "udp" (the reference's; no extra call).
  std::string transport = "udp";
  // How worker threads wait for results (wait.h): polling without sleeping (busy_poll), or
  // sleeping until several results can be handled at once (wake_batch).
  WaitOptions wait;
  // Pin worker thread t to the t-th CPU this process may run on, round robin (ours; off by
  // default). For workers that share a host with the switch (shm, `switchml run`): with the
  // switch's threads pinned the same way (switchml switch --pin-threads), worker thread t and
  // switch thread t, which exchange every datagram, share one core's caches instead of moving
  // each datagram between two cores (docs/architecture.md, "Pinned threads"). Leave it off
  // where the process's other work needs those CPUs.
  bool pin_threads = false;
  // Loopback multicast (beyond the reference; docs/architecture.md, "Multicast results"): with
  // the switch on this host (a loopback switch_host) and the "udp" or "shm" transports, each
  // worker thread also listens on a multicast group of its job (shm: a ring the switch writes
  // each result into once), so the switch sends each result once for all
  // workers instead of once per worker (one kernel copy instead of num_workers). Used only when
  // every worker of the job asks for it and the switch has it; otherwise, and with
  // authenticate_data, results come one per worker as in the reference. Local processes could
  // join the group and read the results: turn it off where other users share the host.
  bool loopback_multicast = true;
  // LAN multicast (beyond the reference; docs/architecture.md, "Multicast results"): with the
  // switch on another host (not a loopback switch_host) and the "udp" transports, each worker
  // thread joins a multicast group of its job on the interface toward the switch, so the switch
  // sends each result once and the network (a switch or bridge) replicates it. Where it cannot
  // be had, results come one per worker as in the reference: the interface has no multicast,
  // the switch does not keep the group (it is bound to 0.0.0.0, runs without LAN multicast, or
  // is a reference switch), authenticate_data is on, or, at run time, the network does not
  // deliver the group to a worker (the switch then sends that worker's results to it alone).
  // Only with loopback_multicast (Validate refuses LAN multicast alone, which no --multicast
  // mode sets). Anyone on the segment could join the group and read the results, and a segment
  // without IGMP snooping and a querier floods them to every port: turn it off there.
  bool lan_multicast = true;
  // LAN multicast or a clear error (switchml worker --multicast on): setup fails when the LAN
  // group cannot be had, and a job fails, naming the group and interface, when its results come
  // only as retransmission replies (the network drops the group's datagrams). Needs
  // lan_multicast; not with authenticate_data.
  bool lan_multicast_required = false;
  // Retransmission (retransmit.h): the timeout of a packet (`timeout` until the first round trip
  // is measured, then from the measured round trips as TCP computes it, within [min_timeout,
  // max_timeout]), the reference's back-off, early retransmission (ours, off by default), and
  // the peer timeout: an all-reduce fails with DEADLINE_EXCEEDED when no result arrives for
  // that long (a peer or the switch is gone). Each worker thread's session takes it whole.
  RetransmitOptions retransmit;
  // Session setup and barriers fail with DEADLINE_EXCEEDED after this long.
  std::chrono::milliseconds setup_timeout{30000};
  // The job's secret, the same bytes on every worker (at most 64; `switchml run` and the PyTorch
  // backend make a random one): only requests carrying it can join, fail, re-create or close
  // the job on the switch (docs/security.md). Empty: an unprotected job.
  std::string job_secret;
  // The authenticated data plane (docs/security.md 4.4; beyond the reference): every datagram
  // between this worker and the switch carries an 8-byte tag keyed with a per-job key that the
  // switch hands out at setup; datagrams that do not verify are dropped and counted
  // (ContextStats::auth_dropped). Every worker of a job must set the same; off by default (the
  // reference wire format).
  bool authenticate_data = false;
  // Block-sparse all-reduces (docs/protocol.md 2.5; beyond the reference): every all-reduce of
  // this context sends only the blocks (packet_numel elements) that are non-zero on some worker,
  // after an announcement of each worker's non-zero blocks (one round trip, about 0.05-0.1 % of
  // the dense traffic); blocks zero on every worker come back as zeros without crossing the
  // network. Results are those of a dense all-reduce, bit for bit. Every worker of a job must set
  // the same (the switch refuses a mismatch), and the switch must support it (setup fails with
  // FAILED_PRECONDITION otherwise). Pays off when many blocks are zero on every worker; a dense
  // tensor costs the announcement and a read of the input more. Off by default.
  bool sparse = false;
  // With sparse, the automatic choice (docs/protocol.md 2.5, "auto"): after the announcement, a
  // worker thread whose union holds more than 7/8 of its blocks runs its whole share dense (with
  // one worker thread: in place on the tensor, without the copies in and out of the compact
  // buffer), else the compact union. The choice rests on the announced sums, which every worker
  // receives alike, so every worker makes the same one. A switch without block-sparse support
  // runs the job dense (every worker is told the same) instead of failing setup. Every worker of
  // a job must set the same. For callers that cannot know which tensors are sparse (the PyTorch
  // backend's default): a dense tensor costs only the announcement (one round trip, and a read of
  // one element per block of a tensor with no zero block).
  bool sparse_auto = false;
  // Check with the switch that every worker all-reduces the same element count and type (one
  // small control message per all-reduce; the result is returned only once the check passed).
  bool check_tensors = true;
  // TLS on the control channel (PEM files; docs/security.md). Empty tls_ca_file: plaintext.
  // tls_cert_file + tls_key_file: this worker's certificate, for a switch that requires one.
  // tls_server_name: the name the switch's certificate must carry, when not switch_host.
  std::string tls_ca_file;
  std::string tls_cert_file;
  std::string tls_key_file;
  std::string tls_server_name;

  // OK, or a message that says which field is wrong and what to use instead.
  Status Validate() const;
  // The window the worker uses: max_outstanding_packets, or when it is 0 the bandwidth-delay
  // rule's. Call on a valid config (with packet_numel 0, before setup chose the size: the
  // window of 256-element packets).
  uint32_t OutstandingPackets() const;
};

}  // namespace switchml
