// Config: everything a worker process needs to join a SwitchML job. A plain struct with
// defaults; tools fill it from flags; the library never reads the environment.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include "switchml/status.h"

namespace switchml {

struct Config {
  // This worker's rank in [0, num_workers) and the job's number of workers.
  uint32_t rank = 0;
  uint32_t num_workers = 1;
  // The switch's control plane (gRPC); its data port comes back from the session setup.
  std::string switch_host = "127.0.0.1";
  uint16_t control_port = 50099;
  // The job's identity on the switch; every worker of a job must use the same one and
  // concurrent jobs must differ. 0: rank 0 picks one and broadcasts it (the reference's way,
  // fine for one job at a time).
  uint64_t session_id = 0;
  // Worker threads, each with its own UDP port, slots and window; every worker of a job must
  // use the same value.
  uint32_t num_worker_threads = 1;
  // Packets in flight per worker (all threads together) = slots used on the switch.
  uint32_t max_outstanding_packets = 256;
  // Elements per packet: 64 or 256.
  uint32_t packet_numel = 256;
  // Local IPv4 address to bind ("0.0.0.0": any) and first UDP port (0: pick free ones).
  std::string bind_address = "0.0.0.0";
  uint16_t udp_port = 0;
  // The data-plane transport: "udp" (kernel UDP with segmentation offloads, GSO and GRO, where
  // the kernel has them) or "udp-plain" (kernel UDP without them).
  std::string transport = "udp";
  // Wait for results by polling without sleeping: lower latency, a core kept busy per thread.
  bool busy_poll = false;
  // Retransmission timeout of a packet and the reference's back-off policy.
  std::chrono::milliseconds timeout{10};
  uint32_t timeout_threshold = 100;
  uint32_t timeout_threshold_increment = 100;
  // An all-reduce fails with DEADLINE_EXCEEDED when no result arrives for this long
  // (a peer or the switch is gone).
  std::chrono::milliseconds peer_timeout{10000};
  // Session setup and barriers fail with DEADLINE_EXCEEDED after this long.
  std::chrono::milliseconds setup_timeout{30000};

  // OK, or a message that says which field is wrong and what to use instead.
  Status Validate() const;
};

}  // namespace switchml
