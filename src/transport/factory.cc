#include "transport/factory.h"

#include "base/status_macros.h"
#include "transport/dpdk.h"
#include "transport/environment.h"
#include "transport/lossy.h"
#include "transport/shm.h"
#include "transport/udp.h"
#include "transport/xdp.h"

namespace switchml::transport {
namespace {

bool Built() { return true; }

Result<Transports> OpenUdpPlain(const TransportOptions& options, size_t count) {
  TransportOptions o = options;
  o.udp.gso = o.udp.gro = false;
  return OpenUdpConsecutive(o, count);
}

// The environment's reader of each kind (environment.h).
Status XdpEnvironment(const EnvironmentLookup& env, TransportOptions* o) {
  return ReadXdpEnvironment(env, &o->xdp);
}
Status DpdkEnvironment(const EnvironmentLookup& env, TransportOptions* o) {
  return ReadDpdkEnvironment(env, &o->dpdk);
}
Status ShmEnvironment(const EnvironmentLookup& env, TransportOptions* o) {
  return ReadShmEnvironment(env, &o->shm);
}

Capabilities KernelUdp(bool offloads) {
  Capabilities c;
  c.host_multicast = c.lan_multicast = true;
  c.segmentation_offloads = offloads;
  return c;
}

Capabilities Xdp() {
  Capabilities c;
  c.one_process_per_interface = true;
  c.max_datagram_bytes = kXdpMaxDatagramBytes;
  return c;
}

Capabilities Dpdk() {
  Capabilities c;
  c.lends_receive_buffers = true;
  c.max_datagram_bytes = kDpdkMaxDatagramBytes;
  return c;
}

Capabilities Shm() {
  Capabilities c;
  c.lends_destination_memory = true;
  c.host_multicast = true;
  c.host_local = true;
  c.files_outlive_processes = true;
  return c;
}

std::string KindList() {
  std::string list;
  for (const TransportKind& k : TransportTable()) {
    list += (list.empty() ? "" : ", ") + std::string(k.name);
  }
  return list;
}

}  // namespace

Status TransportOptions::Validate() const {
  if (FindTransportKind(kind) == nullptr) {
    return InvalidArgumentError("unknown transport '" + kind + "': use one of " + KindList());
  }
  if (!(loss >= 0 && loss < 1)) {
    return InvalidArgumentError("transport loss must be in [0, 1), e.g. 0.01 for 1%");
  }
  return Status();
}

const std::vector<TransportKind>& TransportTable() {
  static const auto* table = new std::vector<TransportKind>{
      {"udp", OpenUdpConsecutive, KernelUdp(true), Built, nullptr},
      {"udp-plain", OpenUdpPlain, KernelUdp(false), Built, nullptr},
      {"xdp", OpenXdpConsecutive, Xdp(), XdpAvailable, XdpEnvironment},
      {"dpdk", OpenDpdkConsecutive, Dpdk(), DpdkAvailable, DpdkEnvironment},
      {"shm", OpenShmConsecutive, Shm(), Built, ShmEnvironment},
  };
  return *table;
}

const TransportKind* FindTransportKind(std::string_view name) {
  for (const TransportKind& k : TransportTable()) {
    if (name == k.name) return &k;
  }
  return nullptr;
}

Capabilities CapabilitiesOf(std::string_view kind) {
  const TransportKind* k = FindTransportKind(kind);
  return k == nullptr ? Capabilities{} : k->capabilities;
}

std::vector<std::string> TransportKinds() {
  std::vector<std::string> names;
  for (const TransportKind& k : TransportTable()) names.emplace_back(k.name);
  return names;
}

Result<std::string> ChooseAutoTransport(std::string_view served, uint16_t data_port,
                                        const EnvironmentLookup& env) {
  if (served.empty() || served == "udp" || served == "udp-plain") return std::string("udp");
  if (served == "shm") {
    ShmOptions shm;
    RETURN_IF_ERROR(ReadShmEnvironment(env, &shm));
    const std::string dir = ShmDirectory(shm);
    if (ShmPortHeld(dir, data_port)) return std::string("shm");
    return FailedPreconditionError(
        "transport auto: the switch serves shm (shared memory with the processes of its host), "
        "but no live shm inbox of its data port " +
        std::to_string(data_port) + " is in " + dir +
        ": run this worker on the switch's host with the switch's SWITCHML_SHM_DIR (and user), "
        "or run the switch with --transport udp");
  }
  return FailedPreconditionError("transport auto: the switch serves " + std::string(served) +
                                 ", which auto does not pick (it needs a device or privileges of "
                                 "its own): set transport " +
                                 std::string(served) +
                                 " (SWITCHML_TRANSPORT=" + std::string(served) +
                                 ", switchml worker --transport " + std::string(served) + ")");
}

Result<std::unique_ptr<Transport>> OpenTransport(const TransportOptions& options) {
  ASSIGN_OR_RETURN(Transports ts, OpenTransports(options, 1));
  return std::move(ts[0]);
}

Result<Transports> OpenTransports(const TransportOptions& options, size_t count) {
  RETURN_IF_ERROR(options.Validate());
  const TransportKind& kind = *FindTransportKind(options.kind);
  TransportOptions o = options;
  // A kind missing from this build says so first (its open), whatever its variables hold.
  if (kind.built() && kind.read_environment != nullptr) {
    RETURN_IF_ERROR(kind.read_environment(ProcessEnvironment(), &o));
  }
  ASSIGN_OR_RETURN(Transports ts, kind.open(o, count));
  if (o.loss > 0) {
    for (size_t i = 0; i < ts.size(); ++i) {
      ts[i] = MakeLossy(std::move(ts[i]), o.loss, o.loss_seed + i);
    }
  }
  return ts;
}

}  // namespace switchml::transport
