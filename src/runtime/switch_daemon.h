// SwitchDaemon: the software switch as a service: the pure data plane (dataplane::Switch) fed by
// a datagram transport (transport/factory.h; kernel UDP with GSO/GRO by default) on one thread,
// plus the gRPC control plane, in one object.
//
// The data-plane loop receives a batch, runs every datagram through the Switch with its reply
// written straight into a transmit buffer lent by the transport, groups the replies by
// destination (so the kernel can send each worker's run of replies as one segmented send) and
// sends them.
//
// Used by `switchml switch`, by `switchml run` and by tests. Thread-safe: counters and Stop()
// may be called from any thread while the data-plane thread runs.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "control/control_server.h"
#include "dataplane/switch.h"
#include "switchml/status.h"
#include "transport/transport.h"

namespace switchml::runtime {

struct SwitchDaemonOptions {
  std::string bind_address = "0.0.0.0";
  uint16_t data_port = 48864;     // 0: pick a free port
  uint16_t control_port = 50099;  // 0: pick a free port
  dataplane::SwitchConfig switch_config;
  // The data-plane transport's kind (transport/factory.h: "udp", "udp-plain").
  std::string transport = "udp";
  // Poll the data-plane socket without sleeping (lower latency, one core kept busy).
  bool busy_poll = false;
  // Drop this fraction of packets in each direction (received, and each copy sent), as the
  // reference P4 program's drop simulator does, to exercise loss recovery.
  double loss = 0;
  uint64_t seed = 1;
  Status Validate() const;
};

struct DaemonCounters {
  uint64_t received = 0;
  uint64_t sent = 0;
  uint64_t loss_dropped_in = 0;
  uint64_t loss_dropped_out = 0;
  uint64_t truncated = 0;  // datagrams longer than any SwitchML packet (dropped)
  // The data-plane transport's system calls: how well receives and sends are batched.
  uint64_t receive_calls = 0;
  uint64_t send_calls = 0;
  uint64_t coalesced_receives = 0;  // receives that returned a run of datagrams (UDP GRO)
  uint64_t segmented_sends = 0;     // sends that carried a run of datagrams (UDP GSO)
};

class SwitchDaemon {
 public:
  static Result<std::unique_ptr<SwitchDaemon>> Start(const SwitchDaemonOptions& options);
  ~SwitchDaemon();  // Stop()s

  uint16_t data_port() const { return data_port_; }
  uint16_t control_port() const { return control_->port(); }
  // Stops the control plane and the data-plane thread. Idempotent.
  void Stop();

  DaemonCounters counters() const;
  // The daemon's counters plus the switch's per-job (and optionally per-slot) tables.
  std::string FormatCounters(bool per_slot);
  dataplane::LockedSwitch& locked_switch() { return *switch_; }

 private:
  explicit SwitchDaemon(const SwitchDaemonOptions& options);
  void Run();
  // Orders tx_ by destination (stable: each destination's replies keep their order) into
  // sorted_, so that each destination's replies are consecutive.
  void GroupByDestination();

  SwitchDaemonOptions options_;
  std::unique_ptr<dataplane::LockedSwitch> switch_;
  std::unique_ptr<transport::Transport> transport_;
  std::unique_ptr<control::ControlServer> control_;
  uint16_t data_port_ = 0;
  std::atomic<uint64_t> received_{0}, sent_{0}, truncated_{0};
  // Data-plane thread scratch, sized once: the batch's replies and their grouping.
  std::vector<transport::TxDatagram> tx_, sorted_;
  std::vector<uint32_t> tx_bucket_;              // tx_[i]'s destination bucket
  std::unordered_map<Endpoint, uint32_t> buckets_;  // destination -> bucket, kept across batches
  std::vector<uint32_t> bucket_start_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace switchml::runtime
