#include "control/request_rules.h"

#include "base/endpoint.h"
#include "base/status_macros.h"
#include "proto/wire.h"

namespace switchml::control {
namespace {

// A striped job's list of switch hosts (64 hosts of "255.255.255.255:65535,").
constexpr size_t kMaxSwitchListBytes = 64 * 22;
// UDP ports (worker threads) one worker may register.
constexpr uint32_t kMaxPortsPerWorker = 64;

// A job's worker count: at least 1, at most the switch's limit (errors start with `what`).
Status CheckNumWorkers(const std::string& what, uint32_t n, const dataplane::SwitchConfig& config) {
  if (n == 0) return InvalidArgumentError(what + ": num_workers is 0; it must be at least 1");
  if (n > config.max_workers_per_job) {
    return InvalidArgumentError(what + ": num_workers " + std::to_string(n) +
                                " exceeds this switch's limit of " +
                                std::to_string(config.max_workers_per_job) + " workers per job");
  }
  return Status::Ok();
}

}  // namespace

std::string PacketSizeName(int value) {
  static const char* const kNames[] = {"MTU_128",  "MTU_256",  "MTU_512", "MTU_1024",
                                       "MTU_2048", "MTU_4096", "MTU_8192"};
  return value >= 0 && value < 7 ? kNames[value] : std::to_string(value);
}

Status ValidateRegistration(const RegistryOptions& options, const dataplane::SwitchConfig& config,
                            const RegisterRequest& r, const Caller& caller, uint32_t* worker_ipv4) {
  const std::string name = SessionName(r.job_id);
  if (r.secret.size() > kMaxSecretBytes) {
    return InvalidArgumentError("job secret of " + std::to_string(r.secret.size()) +
                                " bytes is too long (at most " + std::to_string(kMaxSecretBytes) +
                                ")");
  }
  if (r.switch_list.size() > kMaxSwitchListBytes) {
    return InvalidArgumentError(
        "the list of switch hosts (" + std::to_string(r.switch_list.size()) +
        " bytes) is too long (at most " + std::to_string(kMaxSwitchListBytes) + ")");
  }
  if (options.require_secret && r.secret.empty()) {
    return PermissionDeniedError(
        "this switch requires a job secret (--require-secret) and the request has none");
  }
  if (r.authenticate_data && !options.authenticated_data_unsupported.empty()) {
    return FailedPreconditionError("the authenticated data plane (--auth-data) is not available: " +
                                   options.authenticated_data_unsupported +
                                   "; run the job without --auth-data");
  }
  if (options.require_authenticated_data && !r.authenticate_data) {
    return FailedPreconditionError(
        "this switch requires the authenticated data plane (--require-auth-data) and the request "
        "does not ask for it: start every worker with --auth-data "
        "(Config::authenticate_data)");
  }
  if (r.job_id == 0 || r.job_id == UINT64_MAX) {
    return InvalidArgumentError("session id " + std::to_string(r.job_id) +
                                " is reserved; use 1 .. 2^64 - 2");
  }
  if (r.packet_size < 0 || r.packet_size > 6 ||
      !proto::IsSupportedSize(static_cast<proto::SizeCode>(r.packet_size))) {
    return InvalidArgumentError("packet size " + PacketSizeName(r.packet_size) +
                                " is not supported; use 64, 256, 512, 1024 or 2048 elements per "
                                "packet (512 and up where the switch enables them)");
  }
  const auto size = static_cast<proto::SizeCode>(r.packet_size);
  if (!dataplane::AcceptsSize(config, size)) {
    // A jumbo size (docs/protocol.md 2.6) on a switch that does not enable it: the message names
    // the largest this switch takes, and both ways out.
    const std::string numel = std::to_string(proto::NumelOf(size));
    return FailedPreconditionError(
        "packet size " + PacketSizeName(r.packet_size) + " (packet_numel " + numel +
        ") is not enabled on this switch: it takes at most " +
        std::to_string(config.max_packet_numel) + " elements per packet; use packet_numel " +
        std::to_string(config.max_packet_numel) + " or less, or start the switch with " +
        "--max-packet-numel " + numel);
  }
  if (r.sparse_auto && !r.sparse) {
    return InvalidArgumentError(name +
                                ": sparse_auto without sparse: the automatic choice is one "
                                "of block-sparse all-reduces (set both, or neither)");
  }
  RETURN_IF_ERROR(CheckNumWorkers(name, r.num_workers, config));
  if (r.rank >= r.num_workers) {
    return InvalidArgumentError("rank " + std::to_string(r.rank) + " is out of range for " +
                                std::to_string(r.num_workers) + " workers (ranks are 0.." +
                                std::to_string(r.num_workers - 1) + ")");
  }
  const uint32_t num_ports = r.num_udp_ports == 0 ? 1 : r.num_udp_ports;
  if (num_ports > kMaxPortsPerWorker) {
    return InvalidArgumentError("num_udp_ports " + std::to_string(num_ports) +
                                " is more than the " + std::to_string(kMaxPortsPerWorker) +
                                " ports (worker threads) a worker may register");
  }
  const uint32_t window =
      r.max_outstanding_packets == 0 ? kDefaultWindow : r.max_outstanding_packets;
  const uint32_t slots = dataplane::JobSlots(config, size);
  if (window > slots) {
    return InvalidArgumentError(name + ": max_outstanding_packets " + std::to_string(window) +
                                " must be in 1.." + std::to_string(slots) +
                                " (this switch's slots per job" + dataplane::JumboNote(size) + ")");
  }
  if (r.udp_port == 0 && num_ports > 1) {
    return InvalidArgumentError(
        "udp_port 0 (any port) cannot go with " + std::to_string(num_ports) +
        " UDP ports per worker: replies are routed by port offset from each worker's base port, "
        "so register the base port");
  }
  if (r.authenticate_data && r.udp_port == 0) {
    return InvalidArgumentError(
        "the authenticated data plane keys each worker by its UDP ports: register the base port "
        "(udp_port 0, any port, cannot go with authenticate_data)");
  }
  if (r.multicast_group_ipv4 != 0) {
    constexpr uint32_t kAdminScoped = 0xef000000, kAdminScopedMask = 0xff000000;  // 239/8
    if ((r.multicast_group_ipv4 & kAdminScopedMask) != kAdminScoped) {
      return InvalidArgumentError("multicast_group_ipv4 " + Ipv4ToString(r.multicast_group_ipv4) +
                                  " is not an administratively scoped multicast group (239/8)");
    }
    if (r.multicast_group_port == 0 || uint64_t{r.multicast_group_port} + num_ports > 65536) {
      return InvalidArgumentError("multicast_group_port " + std::to_string(r.multicast_group_port) +
                                  " with " + std::to_string(num_ports) +
                                  " ports is not a port range in 1..65535");
    }
  }
  if (r.udp_port > 65535 || (r.udp_port != 0 && uint64_t{r.udp_port} + num_ports > 65536)) {
    return InvalidArgumentError("UDP ports [" + std::to_string(r.udp_port) + ", " +
                                std::to_string(uint64_t{r.udp_port} + num_ports) +
                                ") do not fit below 65536");
  }
  uint32_t ipv4 = r.ipv4;
  if (ipv4 == 0) {
    if (!caller.has_ipv4) {
      return InvalidArgumentError("cannot tell the worker's IPv4 address from the gRPC peer \"" +
                                  caller.peer +
                                  "\": send it in UdpSessionRequest.ipv4 (the worker's data-plane "
                                  "address, host byte order)");
    }
    ipv4 = caller.ipv4;
  } else if (ipv4 == 0xffffffffu || (ipv4 >> 28) == 0xe) {
    return InvalidArgumentError("ipv4 " + Ipv4ToString(ipv4) +
                                " is a broadcast or multicast address, not a worker's");
  } else if (!options.allow_foreign_address && (!caller.has_ipv4 || caller.ipv4 != ipv4)) {
    return PermissionDeniedError(
        "a worker may register only the IPv4 its control connection comes from (" +
        (caller.has_ipv4 ? Ipv4ToString(caller.ipv4) : caller.peer) + "), not " +
        Ipv4ToString(ipv4) +
        ": send ipv4 0, connect from the data-plane address, or start the switch with "
        "--allow-foreign-address");
  }
  *worker_ipv4 = ipv4;
  return Status::Ok();
}

std::string SyncScope(const SyncRequest& q) {
  const char* what = q.broadcast ? "broadcast" : "barrier";
  return q.job_id == 0
             ? std::string("unscoped ") + what + " of " + std::to_string(q.num_workers) + " workers"
             : std::string(what) + " of " + SessionName(q.job_id);
}

Status ValidateSync(const RegistryOptions& options, const dataplane::SwitchConfig& config,
                    const SyncRequest& q, const std::string& scope) {
  if (q.secret.size() > kMaxSecretBytes) {
    return InvalidArgumentError(scope + ": job secret too long (at most " +
                                std::to_string(kMaxSecretBytes) + " bytes)");
  }
  if (options.require_secret && q.secret.empty()) {
    return PermissionDeniedError(scope +
                                 ": this switch requires a job secret (--require-secret) and the "
                                 "request has none");
  }
  RETURN_IF_ERROR(CheckNumWorkers(scope, q.num_workers, config));
  if ((q.broadcast || q.has_rank) && q.rank >= q.num_workers) {
    return InvalidArgumentError(scope + ": rank " + std::to_string(q.rank) +
                                " must be below num_workers " + std::to_string(q.num_workers));
  }
  if (q.broadcast && q.root >= q.num_workers) {
    return InvalidArgumentError(scope + ": root " + std::to_string(q.root) +
                                " must be below num_workers " + std::to_string(q.num_workers));
  }
  if (q.job_id == UINT64_MAX) {
    return InvalidArgumentError(scope + ": session id 2^64 - 1 is reserved");
  }
  return Status::Ok();
}

}  // namespace switchml::control
