#include "transport/transport.h"

#include "base/check.h"

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

}  // namespace switchml::transport
