// Turning user-supplied text into IPv4 addresses and endpoints (for config files and flags).
//
// Free functions; thread-safe. ResolveIpv4 may block on name resolution (getaddrinfo) for a
// hostname; dotted quads never block.
#pragma once

#include <cstdint>
#include <string>

#include "base/endpoint.h"
#include "switchml/status.h"

namespace switchml::transport {

// "10.0.0.1" or a hostname resolved with getaddrinfo (AF_INET only; the first address wins).
// Returns the address in host byte order. Errors: kInvalidArgument for an empty or IPv6 text,
// kNotFound when the name does not resolve, kUnavailable when resolution failed temporarily.
Result<uint32_t> ResolveIpv4(const std::string& host);

// "host" (port = default_port) or "host:port", host as accepted by ResolveIpv4. The port must be
// a decimal number in 1..65535; default_port is used as given. Errors are kInvalidArgument (bad
// syntax or port) or those of ResolveIpv4; every message quotes the text.
Result<Endpoint> ParseHostPort(const std::string& text, uint16_t default_port);

}  // namespace switchml::transport
