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
//   - Barrier and Broadcast are forwarded to the spine, where the whole job meets (with the job's
//     secret and the caller's rank), waiting no longer than the caller does; the spine's error
//     is passed on with its typed reason (the spine's expiry naming the missing ranks stays one).
//   - Liveness and tensor checks span both levels: the ToR attaches its own stream to the spine
//     (as "rack r (ranks a..b)") when it opens the upstream job, and takes its workers' Attach
//     streams (global rank mapped to the rack's, errors naming the global rank). An all-reduce
//     check its rack agreed on is announced up and confirmed to the rack only when the spine
//     confirms it (every rack agreed). A failure of the ToR's job (a worker's stream broke, a
//     check failed in the rack) is reported up the stream with its reason, and the spine fails
//     the job on every rack with it; a failure at the spine ends the ToR's stream, and the ToR
//     fails its job with the spine's reason. A job its rack closed is closed at the spine too, and
//     after a failure, or when the ToR's registry accepted the rack's first rank again (the
//     upstream is dropped then, not before: a registration it refuses leaves the live job alone),
//     the ToR closes its rank at the spine as well, which frees the spine's job when the ToR's
//     stream never attached there (instead of at the spine's lease).
//     (The ControlServer calls OnJobEnded and OnCheckAgreed through its RegistryHooks; the
//     Uplink reaches the ToR's registry through set_registry.)
// A switch with an uplink serves hierarchical jobs only.
//
// Thread-safety: all methods are thread-safe (called from the ControlServer's RPC threads).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "control/control_client.h"
#include "control/registry.h"
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
  // Session setup calls to the upstream, and the wait of a rack's ranks for its local rank 0
  // (that wait ends at the registering worker's deadline too, if that comes first).
  std::chrono::milliseconds timeout{30000};
  // Forwarded barriers and broadcasts (they wait for the whole job), at most: a call waits no
  // longer than its caller's deadline either.
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

  Status BeforeUdpSession(switchml_proto::UdpSessionRequest* request,
                          std::chrono::system_clock::time_point deadline) override;
  Status AfterUdpSession(const switchml_proto::UdpSessionRequest& sent,
                         const switchml_proto::UdpSessionRequest& request,
                         std::chrono::system_clock::time_point deadline) override;
  // The rack's local rank 0 was refused: unless a live job is left as it was, its rack's other
  // ranks stop waiting for it, with why.
  void UdpSessionRefused(const switchml_proto::UdpSessionRequest& sent,
                         const switchml_proto::UdpSessionRequest& request,
                         const Status& why) override;
  Status BeforeAttach(switchml_proto::AttachRequest* request) override;
  Status BeforeClose(switchml_proto::CloseRequest* request) override;
  bool ForwardsSync() const override { return true; }
  // Forwarded to the upstream switch; its error and the reason beside it are passed on.
  Status Barrier(const switchml_proto::BarrierRequest& request,
                 std::chrono::system_clock::time_point deadline,
                 control::ErrorReason* reason) override;
  Result<uint64_t> Broadcast(const switchml_proto::BroadcastRequest& request,
                             std::chrono::system_clock::time_point deadline,
                             control::ErrorReason* reason) override;

  // The ToR's registry (the ControlServer's), once it runs; not owned, must outlive the Uplink
  // or be reset to nullptr first.
  void set_registry(control::Registry* registry);
  // RegistryHooks of the ToR's registry: its job for `job_id` ended (OK: closed or expired;
  // else the failure), and its rack agreed on all-reduce `op`.
  void OnJobEnded(uint64_t job_id, const Status& why);
  void OnCheckAgreed(uint64_t job_id, uint64_t op, uint64_t count, uint32_t dtype);

  // Releases calls waiting for their rack's first rank and forwarded barriers and broadcasts
  // (they fail with UNAVAILABLE), makes later ones fail at once and ends the upstream streams
  // (the spine fails those jobs): call before shutting the control server down (which waits
  // for the calls under way).
  void Shutdown();

 private:
  struct Session {
    RackPlacement rack;
    uint32_t global_workers = 0;
    std::string secret;
    std::shared_ptr<control::Attachment> upstream;  // the ToR's stream to the spine
    std::shared_ptr<std::atomic<bool>> live;        // while `upstream` is the job's stream
  };
  // Ends the session's upstream stream and its job at the spine (on the task thread), with
  // `why`, without failing anything here. Under mu_.
  void DropUpstreamLocked(uint64_t job_id, Session& s, const Status& why);
  // On the task thread: ends a job's upstream. why OK: closes the ToR's rank at the spine, then
  // the stream. Else: reports the failure up the stream (the spine fails the job on every rack),
  // ends it, and closes the ToR's rank too, which frees the spine's job when the stream had not
  // attached there (it would otherwise wait for the spine's lease).
  void EndUpstream(uint64_t job_id, const std::string& secret,
                   std::shared_ptr<control::Attachment> upstream, const Status& why);
  // Waits (at most options_.timeout, and not past `deadline`) until the tasks posted so far
  // have run: a new upstream registration comes after the end of the ones dropped before it.
  // False when `deadline` came first. Not under mu_.
  bool WaitForPostedTasks(std::chrono::system_clock::time_point deadline);
  // A rank-0 registration of `job_id` counted in registering_ was accepted or refused.
  // Under mu_.
  void RegisteredLocked(uint64_t job_id);
  // Registers the ToR with the spine (rank 0 of its rack registered) and sets the upstream.
  Status OpenUpstream(const switchml_proto::UdpSessionRequest& request);
  // Then attaches the ToR's own stream to the spine: the spine fails the job when this ToR goes
  // away, and this ToR fails its rack's job when the spine fails it.
  Status AttachUpstream(const switchml_proto::UdpSessionRequest& request);
  // Runs `task` on the Uplink's own thread (calls to the spine that may block, and the end of
  // upstream streams, which waits for gRPC).
  void Post(std::function<void()> task);
  // The same with mu_ held (Post would lock it again).
  void PostLocked(std::function<void()> task);
  void RunTasks();

  const UplinkOptions options_;
  dataplane::LockedSwitch* const sw_;
  control::ControlClient setup_client_;
  control::ControlClient sync_client_;
  std::mutex mu_;
  std::condition_variable cv_;
  // Sessions whose local rank 0 registered: OK once the upstream is set, or why it failed.
  std::map<uint64_t, Status> opened_;
  // Sessions with a job on this ToR (created when the registry accepted the rack's local rank 0).
  std::map<uint64_t, Session> sessions_;
  // Rank-0 registrations the registry has not accepted or refused yet, per session: the rack's
  // other ranks wait for them.
  std::map<uint64_t, uint32_t> registering_;
  control::Registry* registry_ = nullptr;
  bool shutting_down_ = false;
  std::deque<std::function<void()>> tasks_;
  uint64_t tasks_posted_ = 0;  // tasks posted, and run, so far (WaitForPostedTasks)
  uint64_t tasks_done_ = 0;
  bool tasks_stop_ = false;
  std::condition_variable tasks_cv_;
  std::thread tasks_thread_;
};

}  // namespace switchml::runtime
