// WaitOptions: how a worker thread waits for the results of its packets. One struct, held whole
// by Config (Config::wait) and by each worker thread (runtime::WorkerThreadOptions::wait), so the
// runtime hands it on without copying fields.
#pragma once

#include "switchml/export.h"
#include "switchml/status.h"

namespace switchml {

struct SWITCHML_EXPORT WaitOptions {
  // Poll the transport without sleeping: lower latency, a core kept busy per worker thread while
  // a slice runs.
  bool busy_poll = false;
  // Wake-up batching (ours; nothing on the wire changes), off when 0: after a worker thread has
  // handled the results that woke it and sent what they freed, it sleeps until about this
  // fraction of the packets it has in flight should have come back at the arrival rate it
  // measured, instead of waking for each run of datagrams the network delivers. Fewer wake-ups
  // (and fewer preemptions of whoever sends those datagrams) on shared cores; a window that
  // covers the longer round trip keeps the link busy (docs/architecture.md 4.5). In [0, 1].
  double wake_batch = 0;

  // OK, or a message that names the field that is wrong and what it must be.
  Status Validate() const;
};

}  // namespace switchml
