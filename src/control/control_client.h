// ControlClient: a worker's side of the switch's gRPC control plane (see control_server.h and
// docs/protocol.md): open a UDP session, and meet the other workers in barriers and broadcasts.
//
// Every call waits for the switch to become reachable (gRPC wait_for_ready), so a switch that
// starts a little after the workers is fine, and gives up after the timeout given at
// construction with a Status that says what to check. Errors the switch returns keep its message.
//
// Thread-safety: all methods are thread-safe and may be called concurrently (gRPC channels and
// stubs are). Blocking: every call blocks for at most the timeout (Barrier and Broadcast until
// all workers arrived). The channel does not use HTTP proxies from the environment.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "base/endpoint.h"
#include "control/error_reason.h"
#include "proto/wire.h"
#include "switchml/status.h"

namespace switchml::control {

struct UdpSessionArgs {
  uint64_t job_id = 0;
  uint32_t rank = 0;
  uint32_t num_workers = 0;
  // The worker's data-plane IPv4 in host byte order (127.0.0.1 = 0x7f000001); 0 = the address
  // the switch sees the control connection come from.
  uint32_t ipv4 = 0;
  // The worker's base UDP source port; 0 = any port from ipv4.
  uint16_t udp_port = 0;
  // Ports [udp_port, udp_port + num_udp_ports), one per worker thread; 0 means 1.
  uint32_t num_udp_ports = 1;
  // The worker's total window; every worker of the session must agree; 0 means 256.
  uint32_t max_outstanding_packets = 256;
  bool running_tsi = true;  // our workers' tsi (see switchml.proto)
  proto::SizeCode size = proto::SizeCode::k1024B;
  // The job's secret (rank 0 creates the job with it; the others must send the same); empty:
  // an unprotected job (docs/security.md).
  std::string job_secret;
  // Ask for the authenticated data plane (docs/security.md 4.4); every worker of a job the same.
  bool authenticate_data = false;
  // The loopback multicast group this worker listens on (port: worker thread 0's); ipv4 0: none.
  Endpoint multicast_group;
  // A job striped over several switch hosts: their control endpoints in the workers' order
  // ("10.0.0.1:50099,10.0.0.2:50099"), which every worker must send alike; empty: one switch.
  std::string switch_list;
  // Ask for a job that may run block-sparse all-reduces (docs/protocol.md 2.5); every worker of a
  // job the same. A switch that does not answer sparse (one without the feature) fails the call,
  // unless sparse_auto is set: the reply then says dense (every worker gets the same answer).
  bool sparse = false;
  // With sparse: the auto rule (docs/protocol.md 2.5: a share whose union holds more than 7/8 of
  // its blocks runs dense); every worker of a job the same.
  bool sparse_auto = false;
};

// TLS for the control channel (PEM files). Empty ca_file: plaintext. cert_file + key_file: the
// client certificate for mutual TLS. server_name: the name to check the switch's certificate
// against, when it differs from the target's host (e.g. the target is an IP address).
struct ControlTlsOptions {
  std::string ca_file;
  std::string cert_file;
  std::string key_file;
  std::string server_name;
};

// A worker's Attach stream (see switchml.proto): its liveness towards the switch, and the
// per-all-reduce check. Destroying it ends the stream (after the rank closed its session, the
// switch takes that as a clean end; before, as a dead worker) and waits until it has ended.
// Thread-safe.
class Attachment {
 public:
  virtual ~Attachment() = default;
  // Announces all-reduce `allreduce` (1, 2, ... in the same order on every worker) of `count`
  // elements of type `dtype`. `checked` runs once: OK when every worker announced the same, or the
  // failure when the job failed first. Against a switch without Attach (a reference switch),
  // at once with OK.
  virtual void Announce(uint64_t allreduce, uint64_t count, uint32_t dtype,
                        std::function<void(const Status&)> checked) = 0;
  // Tells the switch that the job failed on this side, and why (a top-of-rack switch whose rack
  // lost a worker): the switch fails the job on every member with that text. The stream then
  // ends without calling on_failure. Does not block.
  virtual void Fail(const Status& why) = 0;
};

struct UdpSessionReply {
  uint64_t job_id = 0;
  // The switch's data-plane IPv4 (host byte order); 0 = use the control plane's address.
  uint32_t switch_ipv4 = 0;
  // The switch's data-plane UDP port (48864 when the switch does not say, as the reference).
  uint16_t data_port = 0;
  // Workers per job and slots per job pool; 0 when the switch does not say (reference switch).
  uint32_t max_workers = 0;
  uint32_t num_slots = 0;
  // Data-plane threads of the switch on ports data_port .. data_port + num_data_ports - 1
  // (1 when the switch does not say).
  uint32_t num_data_ports = 1;
  // The job's data-plane key (16 bytes) when it asked for authenticate_data; else empty.
  std::string data_key;
  // The job holds the loopback group the request named (UdpSessionResponse.multicast_group_kept).
  bool multicast_group_kept = false;
  // The job allows block-sparse all-reduces (UdpSessionResponse.sparse; true only when the
  // request asked: UdpSession fails when it asked without sparse_auto and the switch did not
  // confirm; with sparse_auto the job then runs dense all-reduces).
  bool sparse = false;
  // The job's shares follow the auto rule (only with sparse).
  bool sparse_auto = false;
};

// What a switch's data plane serves, as its Monitor.Status answers (ours; see switchml.proto).
struct ServedDataPlane {
  std::string transport;   // a kind of transport/factory.h ("udp", "shm", ...); empty: not said
  uint16_t data_port = 0;  // its first data port (0: not said)
  // The largest packet_numel its jobs may use (0: not said; a switch from before the field,
  // which takes 256).
  uint32_t max_packet_numel = 0;
  uint32_t threads = 0;    // its data-plane threads, one port each (0: not said)
};

class ControlClient {
 public:
  // target: "host:port" of the switch's control plane. Does not connect yet.
  ControlClient(std::string target, std::chrono::milliseconds timeout);
  // With TLS (tls.ca_file not empty) or without. Fails when a TLS file cannot be read.
  static Result<std::unique_ptr<ControlClient>> Create(std::string target,
                                                       std::chrono::milliseconds timeout,
                                                       const ControlTlsOptions& tls);
  ~ControlClient();
  ControlClient(ControlClient&&) noexcept;
  ControlClient& operator=(ControlClient&&) noexcept;

  // Registers this worker; rank 0 (re)creates the session's job, so it must come first.
  Result<UdpSessionReply> UdpSession(const UdpSessionArgs& args);
  // Returns once num_workers workers called Barrier with the same job_id (0 = unscoped) and
  // job secret. `rank`, when given, lets the switch refuse two callers with one rank.
  // `deadline`, when given (not the epoch), ends the wait earlier than the client's timeout.
  // `reason`, when not null, receives the typed reason the switch sent beside an error
  // (error_reason.h; kNone without one), for a caller that passes the error on (a top-of-rack
  // switch). A DEADLINE_EXCEEDED with kRoundExpired keeps the switch's message (it names the
  // ranks that did not arrive); one without a reason gets this client's own (docs/protocol.md
  // 4.7).
  Status Barrier(uint64_t job_id, uint32_t num_workers, const std::string& job_secret = "",
                 std::optional<uint32_t> rank = std::nullopt,
                 std::chrono::system_clock::time_point deadline = {},
                 ErrorReason* reason = nullptr);
  // Returns the value of the caller whose rank == root once num_workers workers called. Errors
  // and `reason` as Barrier's.
  Result<uint64_t> Broadcast(uint64_t job_id, uint64_t value, uint32_t rank, uint32_t num_workers,
                             uint32_t root, const std::string& job_secret = "",
                             std::chrono::system_clock::time_point deadline = {},
                             ErrorReason* reason = nullptr);
  // Tells the switch that `rank` (absent: the whole job) is done with the session; waits at most
  // `timeout`. The job's slots are freed once every registered rank closed. `failure` not empty:
  // the session failed on this side, and why; the switch fails it (CloseRequest.failure).
  Status Close(uint64_t job_id, const std::string& job_secret, std::optional<uint32_t> rank,
               std::chrono::milliseconds timeout, const std::string& failure = "");
  // Session.Diagnose (ours): the switch's one-sentence account of why all-reduce `allreduce` of the
  // session may be stuck (which ranks have not started it). UNIMPLEMENTED from a reference
  // switch. Waits at most `timeout`.
  Result<std::string> Diagnose(uint64_t job_id, const std::string& job_secret, uint64_t allreduce,
                               std::chrono::milliseconds timeout);
  // Monitor.Status (ours), for what the data plane serves: a worker's transport "auto" and
  // automatic packet size. A
  // reference switch answers UNIMPLEMENTED, one that requires a job secret PERMISSION_DENIED
  // without one (`job_secret` is sent: one of the caller's jobs). Waits as UdpSession does.
  Result<ServedDataPlane> DataPlane(const std::string& job_secret);
  // Opens this registered worker's Attach stream. `on_failure` runs at most once, from a gRPC
  // thread, when the stream ends for another reason than the Attachment's destruction or Fail:
  // the job failed on the switch (the status says why, e.g. which rank died) or the switch is
  // gone. `member`: how the switch's errors name this worker (empty: "rank R").
  std::unique_ptr<Attachment> Attach(uint64_t job_id, uint32_t rank, const std::string& job_secret,
                                     std::function<void(const Status&)> on_failure,
                                     const std::string& member = "");

  // Whether calls wait for the switch to become reachable (the default, for setup: a switch
  // that starts after the worker is fine). Once a job runs, a worker turns it off: a switch that
  // went away then fails a call at once (UNAVAILABLE) instead of after the timeout.
  void set_wait_for_ready(bool wait);
  // Ends the Barrier and Broadcast calls under way with `why`, and makes later ones fail with it
  // at once (a worker whose job failed: a barrier must not wait for peers that will not come,
  // nor for a switch that is gone). The first reason stays.
  void CancelCalls(const Status& why);

  const std::string& target() const;

 private:
  ControlClient();
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace switchml::control
