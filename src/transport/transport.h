// Datagram transports: move datagrams between endpoints and know nothing of SwitchML.
//
// One interface, one factory per backend (udp.h: kernel UDP with recvmmsg/sendmmsg;
// memory.h: an in-process network with seeded loss, duplication and reordering for tests).
// Thread-safety: a Transport is used by one thread, except Wake(), which any thread may call.
#pragma once

#include <chrono>
#include <cstdint>
#include <span>

#include "base/endpoint.h"
#include "switchml/status.h"

namespace switchml::transport {

struct TxDatagram {
  Endpoint destination;
  std::span<const uint8_t> data;
};

struct RxDatagram {
  std::span<uint8_t> buffer;  // caller-owned storage; a longer datagram is truncated (length
                              // then reports the truncated size and `truncated` is set)
  size_t length = 0;
  Endpoint source;
  bool truncated = false;
};

class Transport {
 public:
  virtual ~Transport() = default;

  // The address this transport receives on.
  virtual Endpoint local_endpoint() const = 0;

  // Hands up to batch.size() datagrams to the network, in order; returns how many were taken
  // (fewer when the send buffer is full: the caller retries the rest later). An error only for
  // a failure of the transport itself, never for one unreachable destination (counted instead).
  virtual Result<size_t> Send(std::span<const TxDatagram> batch) = 0;

  // Receives up to batch.size() datagrams. Waits at most `timeout` for the first one
  // (zero: do not wait); returns 0 on timeout or when woken by Wake().
  virtual Result<size_t> Receive(std::span<RxDatagram> batch, std::chrono::nanoseconds timeout) = 0;

  // Makes a Receive() blocked in another thread return early. Thread-safe.
  virtual void Wake() = 0;
};

}  // namespace switchml::transport
