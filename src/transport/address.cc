#include "transport/address.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cstring>

#include "base/status_macros.h"

namespace switchml::transport {

Result<uint32_t> ResolveIpv4(const std::string& host) {
  if (host.empty())
    return InvalidArgumentError("empty host name; give a hostname or an IPv4 address");
  uint32_t ip = 0;
  if (ParseIpv4(host, &ip)) return ip;
  if (host.find(':') != std::string::npos) {
    return InvalidArgumentError("'" + host +
                                "' looks like an IPv6 address; only IPv4 is supported");
  }
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* list = nullptr;
  const int rc = getaddrinfo(host.c_str(), nullptr, &hints, &list);
  if (rc != 0) {
    std::string message = "cannot resolve host '" + host +
                          "' to an IPv4 address: " + gai_strerror(rc) +
                          "; check the name (or /etc/hosts) or give a dotted-quad address";
    if (rc == EAI_AGAIN) return UnavailableError(std::move(message));
    return NotFoundError(std::move(message));
  }
  Result<uint32_t> result = NotFoundError("host '" + host + "' has no IPv4 address");
  for (addrinfo* a = list; a != nullptr; a = a->ai_next) {
    if (a->ai_family == AF_INET && a->ai_addr != nullptr) {
      sockaddr_in sin;
      std::memcpy(&sin, a->ai_addr, sizeof sin);
      result = ntohl(sin.sin_addr.s_addr);
      break;
    }
  }
  freeaddrinfo(list);
  return result;
}

Result<Endpoint> ParseHostPort(const std::string& text, uint16_t default_port) {
  if (text.empty()) return InvalidArgumentError("empty address; expected host or host:port");
  if (text.front() == '[') {
    return InvalidArgumentError("'" + text + "' is an IPv6 address; only IPv4 is supported");
  }
  const size_t colon = text.find(':');
  if (colon == std::string::npos) {
    ASSIGN_OR_RETURN(uint32_t ip, ResolveIpv4(text));
    return Endpoint{ip, default_port};
  }
  if (text.find(':', colon + 1) != std::string::npos) {
    return InvalidArgumentError("'" + text +
                                "' has more than one ':'; expected host:port (IPv6 is not "
                                "supported)");
  }
  const std::string host = text.substr(0, colon);
  const std::string port_text = text.substr(colon + 1);
  if (host.empty()) {
    return InvalidArgumentError("'" + text + "' has no host before ':'; expected host:port");
  }
  if (port_text.empty()) {
    return InvalidArgumentError("'" + text + "' has no port after ':'; expected host:port");
  }
  uint32_t port = 0;
  for (char c : port_text) {
    if (c < '0' || c > '9') {
      return InvalidArgumentError("bad port '" + port_text + "' in '" + text +
                                  "': expected a decimal number in 1..65535");
    }
    port = port * 10 + static_cast<uint32_t>(c - '0');
    if (port > 65535) break;
  }
  if (port == 0 || port > 65535) {
    return InvalidArgumentError("port '" + port_text + "' in '" + text +
                                "' is out of range: expected 1..65535");
  }
  ASSIGN_OR_RETURN(uint32_t ip, ResolveIpv4(host));
  return Endpoint{ip, static_cast<uint16_t>(port)};
}

}  // namespace switchml::transport
