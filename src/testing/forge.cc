#include "testing/forge.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/ip.h>
#include <netinet/udp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>

#include "proto/wire.h"
#include "transport/udp.h"

namespace switchml::testing {

RawUdpSender::RawUdpSender() : fd_(socket(AF_INET, SOCK_RAW, IPPROTO_RAW)) {}

RawUdpSender::~RawUdpSender() {
  if (fd_ >= 0) close(fd_);
}

bool RawUdpSender::Send(Endpoint source, Endpoint destination, std::span<const uint8_t> payload) {
  std::vector<uint8_t> pkt(sizeof(iphdr) + sizeof(udphdr) + payload.size());
  auto* ip = reinterpret_cast<iphdr*>(pkt.data());
  ip->version = 4;
  ip->ihl = 5;
  ip->ttl = 64;
  ip->protocol = IPPROTO_UDP;
  ip->tot_len = htons(static_cast<uint16_t>(pkt.size()));  // (the kernel fills it in anyway)
  ip->saddr = htonl(source.ipv4);
  ip->daddr = htonl(destination.ipv4);
  auto* udp = reinterpret_cast<udphdr*>(pkt.data() + sizeof(iphdr));
  udp->source = htons(source.port);
  udp->dest = htons(destination.port);
  udp->len = htons(static_cast<uint16_t>(sizeof(udphdr) + payload.size()));
  udp->check = 0;  // none: allowed over IPv4
  if (!payload.empty()) {
    std::memcpy(pkt.data() + sizeof(iphdr) + sizeof(udphdr), payload.data(), payload.size());
  }
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_addr.s_addr = htonl(destination.ipv4);
  return sendto(fd_, pkt.data(), pkt.size(), 0, reinterpret_cast<sockaddr*>(&to), sizeof to) ==
         static_cast<ssize_t>(pkt.size());
}

uint16_t FreeUdpPort() {
  auto probe = transport::OpenUdp(transport::TransportOptions{});
  return probe.ok() ? (*probe)->local_endpoint().port : 0;
}

std::vector<uint8_t> FirstRoundPacket(uint32_t q, int32_t value) {
  proto::Header h;
  h.size = proto::SizeCode::k1024B;
  h.job_number = 1;  // the context's first all-reduce
  h.tsi = q;         // packet q of the first slice: slot q, set 0, running id q
  h.slot = proto::SlotId{static_cast<uint16_t>(q), 0};
  const std::vector<int32_t> values(256, value);
  std::vector<uint8_t> d(proto::kMaxDatagramBytes);
  d.resize(proto::Encode(h, values, d));
  return d;
}

bool WaitUntil(const std::function<bool()>& done, std::chrono::milliseconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (!done()) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

Sprayer::Sprayer(std::function<void()> send_once, std::chrono::milliseconds period)
    : thread_([this, send_once = std::move(send_once), period] {
        while (spraying_.load()) {
          send_once();
          std::this_thread::sleep_for(period);
        }
      }) {}

void Sprayer::Stop() {
  spraying_.store(false);
  if (thread_.joinable()) thread_.join();
}

}  // namespace switchml::testing
