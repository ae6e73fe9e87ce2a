// SessionHooks: how a switch that is one level of a hierarchy (runtime/uplink.h, docs/hierarchy.md)
// takes part in the control plane's calls without the ControlServer knowing about hierarchies.
//
// ControlServerOptions::hooks (optional, not owned) is called by the server:
//   - BeforeUdpSession before a worker is registered: it may rewrite the request (a top-of-rack
//     switch maps the worker's global rank and worker count to its rack's) or refuse it;
//   - AfterUdpSession once the worker is registered (a top-of-rack switch registers itself with
//     its upstream switch when its rack's first rank opens the job, and only then ends the
//     upstream of the job that registration replaced): an error refuses the worker as any
//     registration error does;
//   - UdpSessionRefused when the server's own registration refused the (rewritten) request: a
//     top-of-rack switch then releases its rack's ranks waiting for that registration;
//   (both get the request as the worker sent it, `sent`, and as BeforeUdpSession rewrote it and
//   the server registered or refused it, `registered`; after a successful BeforeUdpSession the
//   server calls exactly one of them;)
//   - BeforeAttach and BeforeClose before a worker's stream is attached or its Close handled: they
//     may rewrite the request (a top-of-rack switch maps the global rank to its rack's, and names
//     the worker by its global rank in AttachRequest.member) or refuse it;
//   - Barrier and Broadcast instead of the server's own rendezvous when ForwardsSync() (a
//     top-of-rack switch forwards them to the upstream switch, where the whole job meets, waiting
//     at most until `deadline`, the caller's): their value answers the call, and the typed
//     reason they set beside an error (*reason; error_reason.h) goes with it.
// Thread-safety: called concurrently. BeforeAttach and BeforeClose run on gRPC's callback
// threads and must not block. The others may block (within the hooks' own timeouts): the server
// runs each such call (a hooked UdpSession, a forwarded Barrier or Broadcast) on a thread of its
// own, never on gRPC's few callback threads, which a blocked call would take from every other
// call (ControlServer::Impl::RunBlocking).
#pragma once

#include <chrono>
#include <cstdint>

#include "control/error_reason.h"
#include "switchml/status.h"

// Declared, not included: this header reaches code that does not see the generated sources
// (control_server.h -> runtime -> bindings); implementations include control/switchml.pb.h.
namespace switchml_proto {
class UdpSessionRequest;
class BarrierRequest;
class BroadcastRequest;
class AttachRequest;
class CloseRequest;
}  // namespace switchml_proto

namespace switchml::control {

class SessionHooks {
 public:
  virtual ~SessionHooks() = default;
  // `deadline`: the caller's (a wait in these ends by then, the worker is gone after it).
  virtual Status BeforeUdpSession(switchml_proto::UdpSessionRequest* request,
                                  std::chrono::system_clock::time_point deadline) = 0;
  virtual Status AfterUdpSession(const switchml_proto::UdpSessionRequest& sent,
                                 const switchml_proto::UdpSessionRequest& registered,
                                 std::chrono::system_clock::time_point deadline) = 0;
  virtual void UdpSessionRefused(const switchml_proto::UdpSessionRequest& sent,
                                 const switchml_proto::UdpSessionRequest& registered,
                                 const Status& why) = 0;
  virtual Status BeforeAttach(switchml_proto::AttachRequest* request) = 0;
  virtual Status BeforeClose(switchml_proto::CloseRequest* request) = 0;
  // Whether Barrier and Broadcast answer those calls (else the server's registry does, and they
  // are never called). Constant for the hooks' lifetime.
  virtual bool ForwardsSync() const = 0;
  // `reason` is never null and holds kNone on entry.
  virtual Status Barrier(const switchml_proto::BarrierRequest& request,
                         std::chrono::system_clock::time_point deadline, ErrorReason* reason) = 0;
  virtual Result<uint64_t> Broadcast(const switchml_proto::BroadcastRequest& request,
                                     std::chrono::system_clock::time_point deadline,
                                     ErrorReason* reason) = 0;
};

}  // namespace switchml::control
