// ConnectFrom: a TCP connection to a loopback port from a chosen 127/8 source address, for tests
// and tools that play many clients on one host (control_listener_test, switchml_abuser).
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>

namespace switchml::testing {

// A connection from `source` (host order, a 127/8 address) to 127.0.0.1:`port`, or -1.
// Non-blocking when `blocking` is false (the connection may still be under way).
inline int ConnectFrom(uint32_t source, uint16_t port, bool blocking = true) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | (blocking ? 0 : SOCK_NONBLOCK), 0);
  if (fd < 0) return -1;
  sockaddr_in from{}, to{};
  from.sin_family = to.sin_family = AF_INET;
  from.sin_addr.s_addr = htonl(source);
  to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  to.sin_port = htons(port);
  if (bind(fd, reinterpret_cast<sockaddr*>(&from), sizeof from) != 0 ||
      (connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof to) != 0 && errno != EINPROGRESS)) {
    close(fd);
    return -1;
  }
  return fd;
}

}  // namespace switchml::testing
