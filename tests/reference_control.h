// A control plane like the reference switch's, for the workers' fallbacks: Session.UdpSession
// answered with the reference's fields only (the session id; the data port is then the
// reference's default), every other call (Monitor.Status, Session.Attach and Close, Sync)
// UNIMPLEMENTED. No data plane behind it. gRPC stays in the .cc (compiled without TSan, as the
// control plane's sources are).
#pragma once

#include <cstdint>
#include <memory>

namespace switchml::testing {

class ReferenceLikeControl {
 public:
  // Listens on 127.0.0.1, a free port; null when the server cannot start.
  static std::unique_ptr<ReferenceLikeControl> Start();
  ~ReferenceLikeControl();
  uint16_t port() const;
  // UdpSession calls answered so far.
  int udp_sessions() const;

 private:
  ReferenceLikeControl();
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace switchml::testing
