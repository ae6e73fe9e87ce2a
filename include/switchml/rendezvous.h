// Rendezvous: how the workers of a job meet while a Context sets up its session and in
// Context::Barrier. By default a Context meets the others through the switch's control plane;
// a framework that already has its own meeting point (PyTorch's c10d store, MPI, a key-value
// service) passes its own Rendezvous to Context::Create instead.
//
// A Rendezvous belongs to one job: the Context calls it with its own rank and worker count,
// and every worker of the job makes the same sequence of calls. Thread-safety: a Context calls
// it from the thread that called Context::Create and then from whichever threads call
// Context::Barrier; calls are never concurrent for one Context if the caller's Barrier calls
// are not. Blocking: both calls block until every worker of the job has called, and should give
// up with DEADLINE_EXCEEDED (or UNAVAILABLE) after a timeout rather than wait forever.
#pragma once

#include <cstdint>

#include "switchml/export.h"
#include "switchml/status.h"

namespace switchml {

class SWITCHML_EXPORT Rendezvous {
 public:
  virtual ~Rendezvous() = default;

  // Returns once every worker of the job has called Barrier the same number of times.
  virtual Status Barrier() = 0;

  // Every worker passes a value; every worker gets rank 0's value back. The Context uses it to
  // agree on the job id when Config::session_id is 0.
  virtual Result<uint64_t> Broadcast(uint64_t value) = 0;
};

}  // namespace switchml
