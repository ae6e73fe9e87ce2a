#include "transport/dpdk_test_util.h"

#include "base/endpoint.h"
#include "transport/dpdk.h"
#include "transport/factory.h"

namespace switchml::transport {

Status DpdkReady(const DpdkReadyOptions& options) {
#if defined(__SANITIZE_ADDRESS__)
  if (options.refuse_under_asan) {
    return UnimplementedError(
        "DPDK's EAL and AddressSanitizer do not share this test process (ASan build)");
  }
#else
  (void)options;
#endif
  static const Status status = []() -> Status {
    if (!DpdkAvailable()) return UnimplementedError("this build has no DPDK (libdpdk-dev missing)");
    TransportOptions o;
    o.kind = "dpdk";
    o.bind_ipv4 = kLoopbackIpv4;
    o.switch_side = true;
    auto t = OpenTransport(o);
    return t.ok() ? Status() : t.status();
  }();
  return status;
}

}  // namespace switchml::transport
