// ControlServer: the switch's gRPC control plane (package switchml_proto, services Session and
// Sync; see switchml.proto and docs/protocol.md, section 4), a thin adapter over a
// control::Registry, which holds every rule (jobs, secrets, rounds, streams, leases, limits).
//
// The server uses gRPC's callback API: a waiting Barrier/Broadcast or an attached worker stream
// holds no thread; the registry completes it through a callback. A waiting call whose client
// cancels or whose deadline passes leaves its round at once (OnCancel). A ticker thread expires
// the leases of jobs whose workers vanished (Registry::Tick, once a second).
//
// Ownership: the server does not own the switch; the LockedSwitch must outlive the server.
// Thread-safety: all methods are thread-safe. Shutdown() releases waiting calls and streams with
// UNAVAILABLE and blocks until every RPC has returned.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "control/call_stats.h"
#include "control/registry.h"
#include "control/switch_snapshot.h"
#include "dataplane/switch.h"
#include "switchml/status.h"

namespace switchml::control {

class SessionHooks;  // session_hooks.h (it includes generated code, which users need not see)

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
  // Jobs, secrets, leases and limits (registry.h).
  RegistryOptions registry;
  RegistryHooks registry_hooks;
  // TLS: with cert_file and key_file (PEM) the server speaks TLS only; with client_ca_file too,
  // every client must present a certificate signed by that CA (mutual TLS).
  std::string tls_cert_file;
  std::string tls_key_file;
  std::string tls_client_ca_file;
  // Hierarchical aggregation: a top-of-rack switch's hooks (session_hooks.h); not owned, must
  // outlive the server. nullptr: a plain switch.
  SessionHooks* hooks = nullptr;
  // Monitor.Status (status_service.h): the data plane's state now; may be empty (the answer then
  // has the control plane's part only).
  std::function<SwitchSnapshot()> snapshot;
  // Control connections per client address and in total (listener.h; the total is also kept
  // within the open-file limit, which Start raises to its hard limit).
  uint32_t max_connections_per_address = 256;
  uint32_t max_connections = 4096;
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

  // Control connections: open now; accepted, refused, closed to make room and closed unread
  // (out of file descriptors) so far.
  struct ConnectionStats {
    uint64_t open = 0, accepted = 0, refused = 0, evicted = 0, shed = 0;
  };
  ConnectionStats connection_stats() const;
  Registry& registry();
  const Registry& registry() const;
  // Every call answered so far, by method and status code (call_stats.h).
  const CallStats& call_stats() const;

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
