#include "transport/transport.h"

#include <random>

#include "base/check.h"
#include "base/status_macros.h"

namespace switchml::transport {

std::span<uint8_t> Transport::TxBuffer(size_t index) {
  CHECK_LT(index, kTxBuffers) << "TxBuffer index out of range";
  const size_t stride = max_datagram_bytes();
  // Allocated (and, being value-initialised, touched) once, on the first call.
  if (tx_arena_.empty()) tx_arena_.resize(kTxBuffers * stride);
  return {tx_arena_.data() + index * stride, stride};
}

Status Transport::JoinGroup(const Endpoint& group, uint32_t interface_index) {
  return UnimplementedError("the " + name() + " transport cannot join multicast groups");
}

TransportCounters SingleWriterTransportCounters::Snapshot() const {
  TransportCounters c;
  c.datagrams_sent = datagrams_sent.Get();
  c.datagrams_received = datagrams_received.Get();
  c.send_errors = send_errors.Get();
  c.truncated = truncated.Get();
  c.send_buffer_full = send_buffer_full.Get();
  c.send_calls = send_calls.Get();
  c.receive_calls = receive_calls.Get();
  return c;
}

Result<std::vector<std::unique_ptr<Transport>>> OpenOnConsecutivePorts(
    uint16_t base_port, size_t count, const std::string& kind, const std::string& where,
    const std::string& if_busy, const OpenOnePort& open_one) {
  constexpr uint32_t kRandomBaseLow = 20000;
  constexpr uint32_t kRandomBaseHigh = 32000;  // exclusive; stays below Linux's ephemeral range
  constexpr int kMaxTries = 200;
  if (count == 0)
    return InvalidArgumentError("count of " + kind + " transports must be at least 1");
  const uint32_t first_base = base_port != 0 ? base_port : kRandomBaseLow;
  if (first_base + count - 1 > 65535) {
    return InvalidArgumentError("cannot open " + std::to_string(count) + " consecutive " + kind +
                                " ports from " + std::to_string(first_base) +
                                ": the range passes 65535; choose a lower base port");
  }
  auto open_range = [&](uint32_t start,
                        bool* in_use) -> Result<std::vector<std::unique_ptr<Transport>>> {
    std::vector<std::unique_ptr<Transport>> transports;
    transports.reserve(count);
    for (size_t i = 0; i < count; ++i) {
      ASSIGN_OR_RETURN(std::unique_ptr<Transport> t,
                       open_one(static_cast<uint16_t>(start + i), in_use));
      transports.push_back(std::move(t));
    }
    return transports;
  };
  bool in_use = false;
  if (base_port != 0) return open_range(base_port, &in_use);
  std::mt19937 rng(std::random_device{}());
  std::uniform_int_distribution<uint32_t> pick(kRandomBaseLow, kRandomBaseHigh - 1);
  for (int attempt = 0; attempt < kMaxTries; ++attempt) {
    const uint32_t start = pick(rng);
    if (start + count - 1 > 65535) continue;
    auto result = open_range(start, &in_use);
    if (result.ok() || !in_use) return result;
  }
  return UnavailableError("could not find " + std::to_string(count) + " consecutive free " + kind +
                          " ports" + where + " with a base in [20000, 32000) after " +
                          std::to_string(kMaxTries) + " tries; " + if_busy +
                          " or give an explicit base port");
}

}  // namespace switchml::transport
