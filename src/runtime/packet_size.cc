#include "runtime/packet_size.h"

#include "proto/wire.h"
#include "switchml/config.h"
#include "transport/auth.h"
#include "transport/factory.h"

namespace switchml::runtime {
namespace {

constexpr uint32_t kSizes[] = {2048, 1024, 512, 256};  // largest first

bool Carries(size_t most, size_t bytes) { return most == 0 || bytes <= most; }

}  // namespace

uint32_t LargestMaxPacketNumel(std::string_view kind) {
  const size_t most = transport::CapabilitiesOf(kind).max_datagram_bytes;
  for (const uint32_t numel : kSizes) {
    if (Carries(most, proto::DatagramBytesForNumel(numel) + transport::kAuthRoomBytes)) {
      return numel;
    }
  }
  return static_cast<uint32_t>(proto::kReferenceMaxNumel);
}

uint32_t ChooseAutoPacketNumel(const PacketSizeLimits& limits, std::string* why) {
  std::string bound;
  uint32_t chosen = static_cast<uint32_t>(proto::kReferenceMaxNumel);
  for (const uint32_t numel : kSizes) {
    const size_t datagram = proto::DatagramBytesForNumel(numel) + limits.extra_bytes;
    const size_t ip = datagram + Config::kIpUdpHeaderBytes;
    if (numel > limits.switch_max) {
      bound = "the switch takes at most " + std::to_string(limits.switch_max);
    } else if (!Carries(limits.transport_max_datagram, datagram)) {
      bound = "the transport carries datagrams of at most " +
              std::to_string(limits.transport_max_datagram) + " bytes";
    } else if (!limits.host_local && limits.mtu == 0) {
      bound = "the MTU toward the switch is unknown";
    } else if (!limits.host_local && ip > limits.mtu) {
      bound = "the MTU toward the switch is " + std::to_string(limits.mtu);
    } else {
      chosen = numel;
      break;
    }
  }
  if (why != nullptr) *why = bound.empty() ? "the largest size" : bound;
  return chosen;
}

}  // namespace switchml::runtime
