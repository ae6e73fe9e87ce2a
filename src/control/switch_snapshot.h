// SwitchSnapshot: what the data plane of a switch is doing now, as plain values, handed by the
// switch daemon (runtime/switch_daemon.h, SwitchDaemon::Snapshot) to the control plane's read-only
// Monitor.Status call and to the Prometheus collector (runtime/switch_metrics.h). The control
// plane owns no data-plane state: it asks for a snapshot through a callback
// (ControlServerOptions::snapshot).
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "dataplane/switch.h"
#include "proto/wire.h"

namespace switchml::control {

// One data-plane thread (shard). Counters since the switch started: they only grow.
struct ThreadSnapshot {
  uint16_t port = 0;
  uint64_t received = 0;
  uint64_t sent = 0;
  double cpu_seconds = 0;  // the thread's CPU time (0 where the clock cannot be read)
  uint64_t receive_calls = 0;
  uint64_t send_calls = 0;
  // Datagrams dropped by the pipeline, by dataplane::DropReason (kNone unused), and why a
  // malformed one was (proto::DecodeError).
  std::array<uint64_t, dataplane::kNumDropReasons> dropped{};
  uint64_t truncated = 0;                              // longer than any SwitchML packet
  uint64_t auth_dropped = 0;                           // tag did not verify (docs/security.md 4.4)
  uint64_t loss_dropped_in = 0, loss_dropped_out = 0;  // the loss simulator
  uint64_t send_errors = 0;
  uint64_t unicast_resends = 0;  // stored results re-sent to a worker that retransmitted
  uint64_t DroppedTotal() const;
};

// One job's data-plane state, summed over the threads. Its counters start over when the job
// changes (created again, a worker added): a counter reset, as Prometheus understands them.
struct JobDataSnapshot {
  dataplane::JobSpec spec;
  dataplane::JobCounters counters;
  uint32_t elements_per_packet = 0;
  uint32_t payload_bytes = 0;
};

struct SwitchSnapshot {
  std::string transport;
  uint16_t data_port = 0;
  std::chrono::system_clock::time_point started{};
  std::chrono::steady_clock::duration uptime{};
  dataplane::SwitchConfig config;
  std::string upstream;  // a top-of-rack switch's upstream control plane, or empty
  uint64_t jobs_evicted = 0;
  std::vector<ThreadSnapshot> threads;
  std::map<uint64_t, JobDataSnapshot> jobs;  // by session id
};

inline uint64_t ThreadSnapshot::DroppedTotal() const {
  uint64_t n = truncated + auth_dropped;
  for (uint64_t d : dropped) n += d;
  return n;
}

}  // namespace switchml::control
