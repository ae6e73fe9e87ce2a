// The transports' environment: every SWITCHML_* variable of the dpdk, xdp and shm backends is
// read here, and nowhere else, into the typed backend options of TransportOptions (options.h,
// which names each field's variable). The factory calls the reader of the kind it opens, once
// per OpenTransports (factory.h's table; a bad SWITCHML_DPDK_* value does not stop a udp
// transport). The tools pass their --dpdk-eal and --dpdk-device on as SWITCHML_DPDK_EAL and
// SWITCHML_DPDK_DEVICE, which the processes `switchml run` starts inherit.
//
// Rules: a variable that is set and not empty overrides its field; one that is unset or empty
// leaves the field as the caller made it. A value that does not parse is refused with an error
// that names the variable, what it accepts and what it got: nothing is read as 0 or as "on" by
// accident (strtoul took "abc" as 0 and "20x" as 20 before; any SWITCHML_XDP_DEBUG, "0" included,
// meant on).
#pragma once

#include <functional>
#include <optional>
#include <string>

#include "switchml/status.h"
#include "transport/options.h"

namespace switchml::transport {

// Looks a variable up: its value, or nullopt when unset. ProcessEnvironment() reads getenv.
using EnvironmentLookup = std::function<std::optional<std::string>(const char* name)>;
EnvironmentLookup ProcessEnvironment();

// The variables of each backend, applied to its struct as the rules above say.
Status ReadXdpEnvironment(const EnvironmentLookup& env, XdpOptions* options);
Status ReadDpdkEnvironment(const EnvironmentLookup& env, DpdkOptions* options);
Status ReadShmEnvironment(const EnvironmentLookup& env, ShmOptions* options);

// The shm directory of this process's transports: $SWITCHML_SHM_DIR if set, else
// /dev/shm/switchml-<uid> (for the tools' removal of the files dead workers left).
std::string DefaultShmDirectory();

}  // namespace switchml::transport
