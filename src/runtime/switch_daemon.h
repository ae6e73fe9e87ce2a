// SwitchDaemon: the software switch as a service: the pure data plane (dataplane::Switch) fed by
// datagram transports (transport/factory.h; kernel UDP with GSO/GRO by default), plus the gRPC
// control plane, in one object.
//
// Threads: `threads` data-plane threads (shards), each with its own transport on its own port
// (data_port + k) and its own replica of the switch; the control plane changes a master Switch
// (LockedSwitch) and each shard mirrors the master's jobs when the master's mutation count moves
// (dataplane::Switch::MirrorJobs), so the data path takes no global lock per batch. Workers send
// the packets of their thread (port offset) t to shard t mod threads (the session response says
// how many data ports there are); a client that ignores that sends everything to shard 0, which
// is correct too, as long as all workers of a job do the same.
//
// A shard's loop receives a batch, runs every datagram through its Switch with the reply written
// straight into a transmit buffer lent by the transport (or over the received datagram itself,
// where the transport lends it for that: DPDK), groups the replies by destination (so the
// kernel sends each worker's run of replies as one segmented send) and sends them.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "control/control_server.h"
#include "control/switch_snapshot.h"
#include "dataplane/switch.h"
#include "runtime/uplink.h"
#include "switchml/status.h"
#include "transport/auth.h"
#include "transport/transport.h"

namespace switchml::runtime {

struct SwitchDaemonOptions {
  std::string bind_address = "0.0.0.0";
  uint16_t data_port = 48864;     // the first shard's; 0: pick free consecutive ports
  uint16_t control_port = 50099;  // 0: pick a free port
  dataplane::SwitchConfig switch_config;
  // Data-plane threads (shards), on ports data_port .. data_port + threads - 1.
  uint32_t threads = 1;
  // The data-plane transport's kind (transport/factory.h: "udp", "udp-plain", "xdp", "dpdk",
  // "shm").
  std::string transport = "udp";
  // Poll the data-plane sockets without sleeping (lower latency, one core kept busy per shard).
  bool busy_poll = false;
  // Pin shard t's thread to the t-th CPU this process may run on, round robin: with workers on
  // this host pinned the same way (Config::pin_threads), each shard shares a core with the
  // worker threads it serves (docs/architecture.md, "Pinned threads").
  bool pin_threads = false;
  // Receive coalescing, the software switch's interrupt moderation (docs/architecture.md 2):
  // after a receive that emptied the data port, sleep this long before the next one (0: off,
  // the default; at most kMaxNap). Each wake-up then finds more datagrams, so the shard and the
  // workers that would wake it spend less CPU sleeping and waking, at the price of up to this
  // much more latency per packet: it helps where the workers' windows are longer than the round
  // trip (queues on slow links), and slows a path whose window just covers it (the figures:
  // docs/benchmarks.md, "Receive coalescing at the switch").
  std::chrono::microseconds nap{0};
  static constexpr std::chrono::microseconds kMaxNap{10000};
  // Multicast results on the LAN (docs/architecture.md, "Multicast results"): with kernel UDP
  // bound to a specific non-loopback address, jobs whose workers ask for it get each result
  // once, sent to their group on that address's interface with this TTL (1..255). Off, or bound
  // to 0.0.0.0: only workers on this host get a (loopback) group.
  bool lan_multicast = true;
  int multicast_ttl = 1;
  // Drop this fraction of packets in each direction (received, and each copy sent), as the
  // reference P4 program's drop simulator does, to exercise loss recovery.
  double loss = 0;
  uint64_t seed = 1;
  // Hierarchical aggregation (runtime/uplink.h, docs/hierarchy.md): this switch is the top of
  // rack rack_index of `racks`, under the switch whose control plane is at `upstream`
  // ("host:port"). Empty: a plain (single-level or spine) switch.
  std::string upstream;
  uint32_t rack_index = 0;
  uint32_t racks = 0;
  // The control plane's jobs, secrets, leases, limits, hooks and TLS (control_server.h). Its
  // address, ports and registry_hooks.activity are set by the daemon from the fields above.
  control::ControlServerOptions control;
  Status Validate() const;
};

// Sums over the shards.
struct DaemonCounters {
  uint64_t received = 0;
  uint64_t sent = 0;
  uint64_t loss_dropped_in = 0;
  uint64_t loss_dropped_out = 0;
  uint64_t truncated = 0;  // datagrams longer than any SwitchML packet (dropped)
  // The data-plane transports' system calls: how well receives and sends are batched.
  uint64_t receive_calls = 0;
  uint64_t send_calls = 0;
  uint64_t coalesced_receives = 0;  // receives that returned a run of datagrams (UDP GRO)
  uint64_t segmented_sends = 0;     // sends that carried a run of datagrams (UDP GSO)
  // Replies the transport could not hand on: skipped for a destination that refused them (a
  // port nobody listens on; over shm also a group ring a live member has not read), and send
  // calls cut short by a full send buffer or ring (the rest retried). Workers recover skipped
  // replies by retransmission.
  uint64_t send_errors = 0;
  uint64_t send_buffer_full = 0;
  // Datagrams from a worker of an authenticated job whose tag did not verify (docs/security.md
  // 4.4): dropped before the data plane.
  uint64_t auth_dropped = 0;
  // Sleeps of receive coalescing (SwitchDaemonOptions::nap).
  uint64_t naps = 0;
};

class SwitchDaemon {
 public:
  static Result<std::unique_ptr<SwitchDaemon>> Start(const SwitchDaemonOptions& options);
  ~SwitchDaemon();  // Stop()s

  // The first shard's data port; shard k listens on data_port() + k.
  uint16_t data_port() const { return data_port_; }
  uint32_t threads() const { return static_cast<uint32_t>(shards_.size()); }
  uint16_t control_port() const { return control_->port(); }
  // Stops the control plane and the data-plane threads. Idempotent.
  void Stop();

  DaemonCounters counters() const;
  // The same for each shard (index k: the thread on data_port() + k).
  std::vector<DaemonCounters> shard_counters() const;
  // The data plane's switch counters and one job's counters, summed over the shards (the job's
  // are empty when no shard has it).
  dataplane::SwitchCounters switch_counters() const;
  std::optional<dataplane::JobCounters> job_counters(uint64_t job_id) const;
  // The daemon's counters plus each shard's per-job (and optionally per-slot) tables.
  std::string FormatCounters(bool per_slot) const;
  // The upstream switch's control plane, or "" (a plain switch).
  const std::string& upstream() const { return options_.upstream; }
  // The control plane's master switch (jobs and workers; its data counters stay zero).
  dataplane::LockedSwitch& locked_switch() { return *switch_; }
  // What the data plane is doing now (control/switch_snapshot.h): each thread's counters, read
  // without a lock (atomics the thread alone writes), and each job's, summed over the threads
  // under each thread's own lock (the one it holds per batch: a reader delays one batch of one
  // thread at most, as the lease ticker's reads of job activity do once a second). For
  // Monitor.Status and the Prometheus collector (runtime/switch_metrics.h).
  control::SwitchSnapshot Snapshot() const;
  // The control plane (its registry and call counters), for the metrics.
  const control::ControlServer& control_server() const { return *control_; }

 private:
  struct Shard;
  explicit SwitchDaemon(const SwitchDaemonOptions& options);
  void Run(Shard& shard);

  SwitchDaemonOptions options_;
  std::unique_ptr<dataplane::LockedSwitch> switch_;
  // The authenticated data plane's keys by worker endpoint: written by the control plane's
  // hooks, read by every shard's transport wrapper (transport/auth.h).
  std::shared_ptr<transport::AuthKeyTable> auth_keys_;
  std::vector<std::unique_ptr<Shard>> shards_;
  std::unique_ptr<Uplink> uplink_;  // the control server's hooks: declared (destroyed) before it
  std::unique_ptr<control::ControlServer> control_;
  uint16_t data_port_ = 0;
  std::chrono::system_clock::time_point started_ = std::chrono::system_clock::now();
  std::chrono::steady_clock::time_point started_steady_ = std::chrono::steady_clock::now();
  std::atomic<bool> stop_{false};
};

}  // namespace switchml::runtime
