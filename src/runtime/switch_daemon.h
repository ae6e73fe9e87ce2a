// SwitchDaemon: the software switch as a service: the pure data plane (dataplane::Switch) fed by
// a UDP transport on one thread, plus the gRPC control plane, in one object.
//
// Used by `switchml switch`, by `switchml run` and by tests. Thread-safe: counters and Stop()
// may be called from any thread while the data-plane thread runs.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <thread>

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

  SwitchDaemonOptions options_;
  std::unique_ptr<dataplane::LockedSwitch> switch_;
  std::unique_ptr<transport::Transport> transport_;
  std::unique_ptr<control::ControlServer> control_;
  uint16_t data_port_ = 0;
  std::mt19937_64 rng_;
  std::atomic<uint64_t> received_{0}, sent_{0}, loss_in_{0}, loss_out_{0}, truncated_{0};
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace switchml::runtime
