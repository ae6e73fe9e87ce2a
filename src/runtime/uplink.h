// Uplink: the control-plane side of a top-of-rack (ToR) switch in a two-level hierarchy
// (docs/hierarchy.md). It plugs into the ToR's ControlServer as its SessionHooks.
//
// Workers are configured as for one switch, with their GLOBAL rank and worker count (so every
// worker quantizes with the same, global, scale), and with their rack's ToR as their switch. The
// ToR knows its rack (rack_index) and the number of racks; rack r holds the global ranks
// [r * N / R, (r + 1) * N / R) of a job of N workers over R racks (contiguous, sizes differing by
// at most one). Then:
//   - UdpSession: the worker's global rank and count become its rack-local ones before the ToR
//     registers it; a worker of another rack is refused with a message naming its rack. When the
//     rack's local rank 0 has registered (creating the ToR's job), the ToR registers itself with
//     the upstream (spine) switch as rank rack_index of `racks` workers of the same session, with
//     its own data ports and the workers' window, packet size and tsi mode, and makes its job a
//     top-of-rack job (dataplane::Switch::SetUpstream) with the spine's data ports. The other
//     local ranks wait (up to `timeout`) until that is done, so the ToR's job is never ready
//     without its upstream. The workers' own handshake orders the spine's registrations: global
//     rank 0 (rack 0's local rank 0) registers alone first, and its UdpSession returns only once
//     rack 0's ToR has opened the spine's job.
//   - Barrier and Broadcast are forwarded to the spine, where the whole job meets.
// A switch with an uplink serves hierarchical jobs only.
//
// Thread-safety: all methods are thread-safe (called from the ControlServer's RPC threads).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "control/control_client.h"
#include "control/session_hooks.h"
#include "dataplane/switch.h"
#include "switchml/status.h"

namespace switchml::runtime {

struct UplinkOptions {
  // "host:port" of the upstream switch's control plane.
  std::string upstream;
  uint32_t rack_index = 0;
  uint32_t racks = 0;
  // This switch's data plane as the upstream should address it: IPv4 in host order (0: the
  // address the upstream sees our control connection come from), first port and port count
  // (one per data-plane thread; every ToR of a job must run the same number).
  uint32_t data_ipv4 = 0;
  uint16_t data_port = 0;
  uint32_t num_data_ports = 1;
  // Session setup calls to the upstream, and the wait of a rack's ranks for its local rank 0.
  std::chrono::milliseconds timeout{30000};
  // Forwarded barriers and broadcasts (they wait for the whole job).
  std::chrono::milliseconds sync_timeout{std::chrono::minutes(10)};
  Status Validate() const;
};

// The rack-local rank and worker count of a global rank (see the file comment); an error when
// the rank is not in rack_index or the job has fewer workers than racks.
struct RackPlacement {
  uint32_t first_rank = 0;   // the rack's first global rank
  uint32_t num_workers = 0;  // the rack's workers
};
Result<RackPlacement> PlaceRack(uint32_t num_workers, uint32_t racks, uint32_t rack_index);

class Uplink final : public control::SessionHooks {
 public:
  // sw: the ToR's master switch (not owned; outlives the Uplink).
  Uplink(const UplinkOptions& options, dataplane::LockedSwitch* sw);
  ~Uplink() override;

  Status BeforeUdpSession(switchml_proto::UdpSessionRequest* request) override;
  Status AfterUdpSession(const switchml_proto::UdpSessionRequest& request) override;
  std::optional<Status> Barrier(const switchml_proto::BarrierRequest& request) override;
  std::optional<Result<uint64_t>> Broadcast(
      const switchml_proto::BroadcastRequest& request) override;
  // Releases calls waiting for their rack's first rank (they fail with UNAVAILABLE) and makes
  // later ones fail at once: call before shutting the control server down.
  void Shutdown();

 private:
  Status OpenUpstream(const switchml_proto::UdpSessionRequest& request);

  const UplinkOptions options_;
  dataplane::LockedSwitch* const sw_;
  control::ControlClient setup_client_;
  control::ControlClient sync_client_;
  std::mutex mu_;
  std::condition_variable cv_;
  // Sessions whose local rank 0 registered: OK once the upstream is set, or why it failed.
  std::map<uint64_t, Status> opened_;
  bool shutting_down_ = false;
};

}  // namespace switchml::runtime
