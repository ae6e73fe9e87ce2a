// SessionHooks: how a switch that is one level of a hierarchy (runtime/uplink.h, docs/hierarchy.md)
// takes part in the control plane's calls without the ControlServer knowing about hierarchies.
//
// ControlServerOptions::hooks (optional, not owned) is called by the server:
//   - BeforeUdpSession before a worker is registered: it may rewrite the request (a top-of-rack
//     switch maps the worker's global rank and worker count to its rack's) or refuse it;
//   - AfterUdpSession once the worker is registered (a top-of-rack switch registers itself with
//     its upstream switch when its rack's first rank opens the job): an error refuses the worker
//     as any registration error does;
//   - Barrier and Broadcast before the server's own rendezvous: a value (a Status or a result)
//     answers the call instead (a top-of-rack switch forwards them to the upstream switch, where
//     the whole job meets); std::nullopt lets the server handle it.
// Thread-safety: called concurrently from the server's RPC threads; may block (within the
// hooks' own timeouts).
#pragma once

#include <cstdint>
#include <optional>

#include "switchml/status.h"

// Declared, not included: this header reaches code that does not see the generated sources
// (control_server.h -> runtime -> bindings); implementations include control/switchml.pb.h.
namespace switchml_proto {
class UdpSessionRequest;
class BarrierRequest;
class BroadcastRequest;
}  // namespace switchml_proto

namespace switchml::control {

class SessionHooks {
 public:
  virtual ~SessionHooks() = default;
  virtual Status BeforeUdpSession(switchml_proto::UdpSessionRequest* request) = 0;
  virtual Status AfterUdpSession(const switchml_proto::UdpSessionRequest& request) = 0;
  virtual std::optional<Status> Barrier(const switchml_proto::BarrierRequest& request) = 0;
  virtual std::optional<Result<uint64_t>> Broadcast(
      const switchml_proto::BroadcastRequest& request) = 0;
};

}  // namespace switchml::control
