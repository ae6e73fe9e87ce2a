#include "bindings/python/software_switch.h"

#include "runtime/packet_size.h"
#include "runtime/switch_daemon.h"
#include "transport/factory.h"

namespace switchml::python {

Result<std::unique_ptr<SoftwareSwitch>> SoftwareSwitch::Start(
    const SoftwareSwitchOptions& options) {
  runtime::SwitchDaemonOptions o;
  o.bind_address = options.bind_address;
  o.data_port = options.data_port;
  o.control_port = options.control_port;
  o.transport = options.transport;
  o.switch_config.max_packet_numel = options.max_packet_numel == 0
                                         ? runtime::LargestMaxPacketNumel(options.transport)
                                         : options.max_packet_numel;
  o.control.registry.require_authenticated_data = options.require_authenticated_data;
  SWITCHML_ASSIGN_OR_RETURN(std::unique_ptr<runtime::SwitchDaemon> daemon,
                            runtime::SwitchDaemon::Start(o));
  return std::unique_ptr<SoftwareSwitch>(new SoftwareSwitch(std::move(daemon)));
}

SoftwareSwitch::SoftwareSwitch(std::unique_ptr<runtime::SwitchDaemon> daemon)
    : daemon_(std::move(daemon)) {}

SoftwareSwitch::~SoftwareSwitch() = default;

uint16_t SoftwareSwitch::data_port() const { return daemon_->data_port(); }
uint16_t SoftwareSwitch::control_port() const { return daemon_->control_port(); }

SoftwareSwitchCounters SoftwareSwitch::counters() const {
  const runtime::DaemonCounters c = daemon_->counters();
  return SoftwareSwitchCounters{.received = c.received,
                                .sent = c.sent,
                                .truncated = c.truncated,
                                .auth_dropped = c.auth_dropped};
}

std::vector<std::string> TransportNames() { return transport::TransportKinds(); }

}  // namespace switchml::python
