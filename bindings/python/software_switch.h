// What the Python module needs of the library beyond its public API: the in-process software
// switch (runtime::SwitchDaemon) and the names of the data-plane transports. Compiled into
// libswitchml_bindings.so and exported from it (SWITCHML_EXPORT), while the library's internals
// stay hidden: the extension modules see this header and include/switchml/ only.
// Thread-safety: a SoftwareSwitch's methods may be called from any thread.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "switchml/export.h"
#include "switchml/status.h"

namespace switchml::runtime {
class SwitchDaemon;
}

namespace switchml::python {

struct SoftwareSwitchOptions {
  std::string bind_address = "127.0.0.1";
  uint16_t data_port = 0;     // 0: free consecutive ports
  uint16_t control_port = 0;  // 0: a free port
  // Refuse jobs without Config::authenticate_data (switchml switch --require-auth-data).
  bool require_authenticated_data = false;
  std::string transport = "udp";  // one of TransportNames()
  // The largest packet_numel a job may use (switchml switch --max-packet-numel): 256, 512, 1024
  // or 2048; 0, as the command's default: the largest the transport carries.
  uint32_t max_packet_numel = 0;
};

// The data plane's datagram counters, summed over its threads.
struct SoftwareSwitchCounters {
  uint64_t received = 0;
  uint64_t sent = 0;
  uint64_t truncated = 0;     // oversized datagrams (dropped)
  uint64_t auth_dropped = 0;  // tags that did not verify (dropped)
};

// The software switch (data plane and control plane) running in this process; stops when
// destroyed (blocks until its threads have ended).
class SWITCHML_EXPORT SoftwareSwitch {
 public:
  static Result<std::unique_ptr<SoftwareSwitch>> Start(const SoftwareSwitchOptions& options);
  ~SoftwareSwitch();
  SoftwareSwitch(const SoftwareSwitch&) = delete;
  SoftwareSwitch& operator=(const SoftwareSwitch&) = delete;

  uint16_t data_port() const;
  uint16_t control_port() const;
  SoftwareSwitchCounters counters() const;

 private:
  explicit SoftwareSwitch(std::unique_ptr<runtime::SwitchDaemon> daemon);
  std::unique_ptr<runtime::SwitchDaemon> daemon_;
};

// The data-plane transports Config::transport and SoftwareSwitchOptions::transport accept.
SWITCHML_EXPORT std::vector<std::string> TransportNames();

}  // namespace switchml::python
