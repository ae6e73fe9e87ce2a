// Test support for the DPDK transport (linked by test binaries only): whether DPDK can run in the
// calling test process, so that its tests skip, saying why, where it cannot.
#pragma once

#include "switchml/status.h"

namespace switchml::transport {

struct DpdkReadyOptions {
  // In an AddressSanitizer build, report UNIMPLEMENTED without starting EAL: once EAL has started
  // in a process ("EAL: Error: Invalid memory"), a later heap write of another transport in it
  // faults (measured in CI's ASan build). For binaries that test other transports in the same
  // process; DPDK under ASan runs in processes of its own (dpdk_multiprocess_test).
  bool refuse_under_asan = false;
};

// OK, or why DPDK cannot run in this process: no DPDK in the build, EAL does not start, or a
// switch-side (memif server) transport does not open on loopback. The probe (which starts EAL)
// runs once per process; later calls return its result.
Status DpdkReady(const DpdkReadyOptions& options = {});

}  // namespace switchml::transport
