// The checks of a control request's fields, made before anything is looked up or allocated
// (docs/security.md): pure functions of the request, the registry's options and the switch's
// configuration; and the names the registry's errors use.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "control/registry.h"
#include "dataplane/switch.h"
#include "switchml/status.h"

namespace switchml::control {

// The window (max_outstanding_packets) of a registration that sends 0.
inline constexpr uint32_t kDefaultWindow = 256;
// Longest job secret accepted (our workers send 32 bytes).
inline constexpr size_t kMaxSecretBytes = 64;

// "session 7".
inline std::string SessionName(uint64_t id) { return "session " + std::to_string(id); }
// "MTU_1024", or the number when it is not a PacketSize.
std::string PacketSizeName(int value);

// A registration (Session.UdpSession): its fields in range and consistent, its secret and data
// plane as this switch requires. *worker_ipv4: the worker's IPv4 (the request's, or the caller's
// when it sends 0), which it may register only when it is the caller's (or the switch allows
// foreign addresses).
Status ValidateRegistration(const RegistryOptions& options, const dataplane::SwitchConfig& config,
                            const RegisterRequest& request, const Caller& caller,
                            uint32_t* worker_ipv4);

// How errors name a Barrier/Broadcast's round: "barrier of session 7", "unscoped broadcast of 4
// workers".
std::string SyncScope(const SyncRequest& request);
// A Barrier/Broadcast: secret, worker count, rank, root and job id in range (errors start
// with `scope`).
Status ValidateSync(const RegistryOptions& options, const dataplane::SwitchConfig& config,
                    const SyncRequest& request, const std::string& scope);

}  // namespace switchml::control
