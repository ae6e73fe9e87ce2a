#include "transport/factory.h"

#include "base/status_macros.h"
#include "transport/dpdk.h"
#include "transport/lossy.h"
#include "transport/shm.h"
#include "transport/udp.h"
#include "transport/xdp.h"

namespace switchml::transport {
namespace {

constexpr const char* kTransportKinds[] = {"udp", "udp-plain", "xdp", "dpdk", "shm"};

std::string KindList() {
  std::string list;
  for (const char* k : kTransportKinds) list += (list.empty() ? "" : ", ") + std::string(k);
  return list;
}

UdpOptions ToUdp(const TransportOptions& o) {
  UdpOptions u;
  u.bind_ipv4 = o.bind_ipv4;
  u.port = o.port;
  u.socket_buffer_bytes = o.socket_buffer_bytes;
  u.max_batch = o.max_batch;
  u.max_datagram_bytes = o.max_datagram_bytes;
  u.multicast_ttl = o.multicast_ttl;
  u.gso = u.gro = o.kind == "udp";
  return u;
}

XdpOptions ToXdp(const TransportOptions& o) {
  XdpOptions x;
  x.bind_ipv4 = o.bind_ipv4;
  x.port = o.port;
  x.max_datagram_bytes = o.max_datagram_bytes;
  x.max_batch = o.max_batch;
  return x;
}

DpdkOptions ToDpdk(const TransportOptions& o) {
  DpdkOptions d;
  d.bind_ipv4 = o.bind_ipv4;
  d.port = o.port;
  d.max_batch = o.max_batch;
  d.max_datagram_bytes = o.max_datagram_bytes;
  d.switch_side = o.switch_side;
  return d;
}

ShmOptions ToShm(const TransportOptions& o) {
  ShmOptions s;
  s.bind_ipv4 = o.bind_ipv4;
  s.port = o.port;
  s.max_datagram_bytes = o.max_datagram_bytes;
  if (o.shm_ring_slots != 0) s.ring_slots = o.shm_ring_slots;
  return s;
}

std::unique_ptr<Transport> MaybeLossy(const TransportOptions& o, std::unique_ptr<Transport> t,
                                      uint64_t index) {
  if (o.loss <= 0) return t;
  return MakeLossy(std::move(t), o.loss, o.loss_seed + index);
}

}  // namespace

Status TransportOptions::Validate() const {
  bool known = false;
  for (const char* k : kTransportKinds) known = known || kind == k;
  if (!known) {
    return InvalidArgumentError("unknown transport '" + kind + "': use one of " + KindList());
  }
  if (!(loss >= 0 && loss < 1)) {
    return InvalidArgumentError("transport loss must be in [0, 1), e.g. 0.01 for 1%");
  }
  return Status();
}

std::vector<std::string> TransportKinds() {
  return std::vector<std::string>(std::begin(kTransportKinds), std::end(kTransportKinds));
}

Result<std::unique_ptr<Transport>> OpenTransport(const TransportOptions& options) {
  RETURN_IF_ERROR(options.Validate());
  if (options.kind == "xdp") {
    ASSIGN_OR_RETURN(auto ts, OpenXdpConsecutive(ToXdp(options), 1));
    return MaybeLossy(options, std::move(ts[0]), 0);
  }
  if (options.kind == "dpdk") {
    ASSIGN_OR_RETURN(auto ts, OpenDpdkConsecutive(ToDpdk(options), 1));
    return MaybeLossy(options, std::move(ts[0]), 0);
  }
  if (options.kind == "shm") {
    ASSIGN_OR_RETURN(auto ts, OpenShmConsecutive(ToShm(options), 1));
    return MaybeLossy(options, std::move(ts[0]), 0);
  }
  ASSIGN_OR_RETURN(std::unique_ptr<Transport> t, OpenUdp(ToUdp(options)));
  return MaybeLossy(options, std::move(t), 0);
}

Result<std::vector<std::unique_ptr<Transport>>> OpenTransports(const TransportOptions& options,
                                                               size_t count) {
  RETURN_IF_ERROR(options.Validate());
  std::vector<std::unique_ptr<Transport>> ts;
  if (options.kind == "dpdk") {
    ASSIGN_OR_RETURN(ts, OpenDpdkConsecutive(ToDpdk(options), count));
  } else if (options.kind == "xdp") {
    ASSIGN_OR_RETURN(ts, OpenXdpConsecutive(ToXdp(options), count));
  } else if (options.kind == "shm") {
    ASSIGN_OR_RETURN(ts, OpenShmConsecutive(ToShm(options), count));
  } else {
    ASSIGN_OR_RETURN(ts, OpenUdpConsecutive(ToUdp(options), count));
  }
  for (size_t i = 0; i < ts.size(); ++i) ts[i] = MaybeLossy(options, std::move(ts[i]), i);
  return ts;
}

}  // namespace switchml::transport
