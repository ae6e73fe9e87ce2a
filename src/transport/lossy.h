// A transport wrapper that drops a seeded random fraction of datagrams in each direction, as the
// reference P4 program's drop simulator does: each received datagram, and each sent one, is lost
// with probability `loss`. Dropped datagrams count in counters().loss_dropped_in / _out; a sent
// one that is dropped counts as taken. Everything else is the wrapped transport's.
//
// Ownership: owns the wrapped transport. Thread-safety: as Transport.
#pragma once

#include <cstdint>
#include <memory>

#include "transport/transport.h"

namespace switchml::transport {

// loss in [0, 1) (CHECKed).
std::unique_ptr<Transport> MakeLossy(std::unique_ptr<Transport> inner, double loss, uint64_t seed);

}  // namespace switchml::transport
