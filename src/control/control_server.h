// ControlServer: the switch's gRPC control plane (package switchml_proto, services Session and
// Sync; see switchml.proto and docs/protocol.md).
//
// Session.UdpSession registers the workers of a job in a dataplane::LockedSwitch: rank 0
// (re)creates the job of its session id, every other rank joins it after its arguments were
// checked against rank 0's. A refused worker marks its session failed, which makes every scoped
// Barrier/Broadcast of that session fail at once (waiting ones included), so a bad configuration
// makes the whole job fail fast instead of hanging until a timeout.
//
// Sync.Barrier and Sync.Broadcast are rendezvous points scoped by session id (0 = unscoped: one
// group per num_workers, as the reference). A waiting call whose client cancels or whose deadline
// passes withdraws from its round, so one failed worker does not corrupt the next round.
//
// Ownership: the server does not own the switch; the LockedSwitch must outlive the server. The
// server locks LockedSwitch::mu around every switch call and never holds it while waiting.
// Thread-safety: all methods are thread-safe. RPCs run on gRPC's synchronous-server threads (up
// to 1024, so many workers can block in barriers at once). Shutdown() blocks until every RPC has
// returned (waiting Barrier/Broadcast calls are released with UNAVAILABLE).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "control/session_hooks.h"
#include "dataplane/switch.h"
#include "switchml/status.h"

namespace switchml::control {

struct ControlServerOptions {
  // The address the gRPC server listens on ("0.0.0.0", "::", "127.0.0.1", ...).
  std::string bind_address = "0.0.0.0";
  // The gRPC port; 0 = pick a free port (see ControlServer::port()).
  uint16_t port = 50099;
  // The switch's data-plane UDP port, returned to workers in UdpSessionResponse.udp_port.
  uint16_t data_port = 48864;
  // How many data ports (data-plane threads) the switch has, from data_port up; returned in
  // UdpSessionResponse.num_data_ports.
  uint32_t num_data_ports = 1;
  // The switch's data-plane IPv4 (host byte order) returned to workers in
  // UdpSessionResponse.ipv4; 0 tells workers to use the control plane's address.
  uint32_t switch_ipv4 = 0;
  // How long a session that refused a worker fails its sync calls (and other ranks' setup):
  // long enough for every worker of that attempt to hear of it; a new attempt with the same
  // session id after that is unaffected (rank 0 re-opening the session clears it at once).
  std::chrono::milliseconds failure_memory{10000};
  // Hierarchical aggregation: a top-of-rack switch's hooks (session_hooks.h); not owned, must
  // outlive the server. nullptr: a plain switch.
  SessionHooks* hooks = nullptr;
  Status Validate() const;
};

class ControlServer {
 public:
  // Starts listening on options.bind_address:options.port and serving in background threads.
  // Fails with a Status naming the address when it cannot listen there (e.g. the port is in
  // use). `sw` is not owned and must outlive the returned server.
  static Result<std::unique_ptr<ControlServer>> Start(const ControlServerOptions& options,
                                                      dataplane::LockedSwitch* sw);

  ControlServer(const ControlServer&) = delete;
  ControlServer& operator=(const ControlServer&) = delete;
  // Calls Shutdown().
  ~ControlServer();

  // The port actually listened on (the picked one when options.port was 0).
  uint16_t port() const;

  // Stops accepting RPCs, releases waiting Barrier/Broadcast calls with UNAVAILABLE and blocks
  // until every handler has returned. Idempotent.
  void Shutdown();

  // Barrier and Broadcast calls currently waiting for their round (for tests and status pages).
  uint32_t waiting_sync_calls() const;

 private:
  struct Impl;
  explicit ControlServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Parses a gRPC peer string ("ipv4:10.0.0.1:5555", "ipv6:[::ffff:10.0.0.1]:5555", also with the
// brackets percent-encoded) into an IPv4 address in host byte order. "ipv6:[::1]" maps to
// 127.0.0.1. False for other IPv6 peers and unparsable strings.
bool ParsePeerIpv4(const std::string& peer, uint32_t* ipv4);

}  // namespace switchml::control
