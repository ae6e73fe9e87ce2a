#include "runtime/uplink.h"

#include <string>

#include "base/logging.h"
#include "base/status_macros.h"
#include "control/switchml.pb.h"
#include "transport/address.h"

namespace switchml::runtime {
namespace {

// Sessions remembered by an Uplink; the oldest ids are forgotten beyond this.
constexpr size_t kMaxOpened = 4096;

std::string RankRange(uint32_t first, uint32_t n) {
  return std::to_string(first) + ".." + std::to_string(first + n - 1);
}

}  // namespace

Status UplinkOptions::Validate() const {
  if (upstream.empty()) return InvalidArgumentError("the upstream switch's host:port is empty");
  if (racks < 1) return InvalidArgumentError("racks must be at least 1");
  if (rack_index >= racks) {
    return InvalidArgumentError("rack index " + std::to_string(rack_index) +
                                " is out of range for " + std::to_string(racks) + " racks (0.." +
                                std::to_string(racks - 1) + ")");
  }
  if (data_port == 0) return InvalidArgumentError("the ToR's data port is 0");
  if (num_data_ports < 1) return InvalidArgumentError("the ToR has no data port");
  if (timeout.count() <= 0 || sync_timeout.count() <= 0) {
    return InvalidArgumentError("uplink timeouts must be positive");
  }
  return Status::Ok();
}

Result<RackPlacement> PlaceRack(uint32_t num_workers, uint32_t racks, uint32_t rack_index) {
  if (racks == 0 || rack_index >= racks) {
    return InvalidArgumentError("rack " + std::to_string(rack_index) + " of " +
                                std::to_string(racks) + " racks does not exist");
  }
  if (num_workers < racks) {
    return InvalidArgumentError("a job of " + std::to_string(num_workers) +
                                " workers cannot span " + std::to_string(racks) +
                                " racks: every rack needs at least one worker");
  }
  const uint64_t n = num_workers;
  RackPlacement p;
  p.first_rank = static_cast<uint32_t>(n * rack_index / racks);
  p.num_workers = static_cast<uint32_t>(n * (rack_index + 1) / racks) - p.first_rank;
  return p;
}

Uplink::Uplink(const UplinkOptions& options, dataplane::LockedSwitch* sw)
    : options_(options),
      sw_(sw),
      setup_client_(options.upstream, options.timeout),
      sync_client_(options.upstream, options.sync_timeout) {}

Uplink::~Uplink() = default;

Status Uplink::BeforeUdpSession(switchml_proto::UdpSessionRequest* request) {
  const uint32_t global_rank = request->rank();
  const uint32_t global_n = request->num_workers();
  if (global_rank >= global_n) return Status::Ok();  // the server's own checks refuse it
  const std::string session = "session " + std::to_string(request->session_id());
  ASSIGN_OR_RETURN(RackPlacement rack, PlaceRack(global_n, options_.racks, options_.rack_index));
  if (global_rank < rack.first_rank || global_rank >= rack.first_rank + rack.num_workers) {
    // Which rack it belongs to: the rack r with first(r) <= rank < first(r + 1).
    uint32_t r = 0;
    while (r + 1 < options_.racks && uint64_t{global_n} * (r + 1) / options_.racks <= global_rank) {
      ++r;
    }
    return InvalidArgumentError(
        session + ": rank " + std::to_string(global_rank) + " of " + std::to_string(global_n) +
        " belongs to rack " + std::to_string(r) + ", but this top-of-rack switch is rack " +
        std::to_string(options_.rack_index) + " of " + std::to_string(options_.racks) + " (ranks " +
        RankRange(rack.first_rank, rack.num_workers) + "): point the worker at its rack's switch");
  }
  const uint32_t local_rank = global_rank - rack.first_rank;
  request->set_rank(local_rank);
  request->set_num_workers(rack.num_workers);
  std::unique_lock lock(mu_);
  if (local_rank == 0) {
    opened_.erase(request->session_id());  // (re)opening: wait for this registration
    return Status::Ok();
  }
  // The rack's local rank 0 creates the ToR's job and opens the upstream: wait for it.
  const bool done = cv_.wait_for(lock, options_.timeout, [&] {
    return shutting_down_ || opened_.contains(request->session_id());
  });
  if (shutting_down_) return UnavailableError("the top-of-rack switch is shutting down");
  if (!done) {
    return DeadlineExceededError(session + ": rank " + std::to_string(rack.first_rank) +
                                 " (this rack's first) did not open the job on this top-of-rack "
                                 "switch within " +
                                 std::to_string(options_.timeout.count()) + " ms");
  }
  return opened_.at(request->session_id());
}

Status Uplink::AfterUdpSession(const switchml_proto::UdpSessionRequest& request) {
  if (request.rank() != 0) return Status::Ok();
  Status st = OpenUpstream(request);
  if (!st.ok()) {
    st = Status(st.code(), "rack " + std::to_string(options_.rack_index) +
                               " cannot join the upstream switch " + options_.upstream + ": " +
                               st.message());
  }
  {
    std::lock_guard lock(mu_);
    if (opened_.size() >= kMaxOpened) opened_.erase(opened_.begin());
    opened_[request.session_id()] = st;
  }
  cv_.notify_all();
  return st;
}

Status Uplink::OpenUpstream(const switchml_proto::UdpSessionRequest& request) {
  control::UdpSessionArgs args;
  args.session_id = request.session_id();
  args.rank = options_.rack_index;
  args.num_workers = options_.racks;
  args.ipv4 = options_.data_ipv4;
  args.udp_port = options_.data_port;
  args.num_udp_ports = options_.num_data_ports;
  args.max_outstanding_packets = request.max_outstanding_packets();
  args.running_tsi = request.running_tsi();
  args.size = static_cast<proto::SizeCode>(request.packet_size());
  ASSIGN_OR_RETURN(control::UdpSessionReply reply, setup_client_.UdpSession(args));
  dataplane::UpstreamSpec up;
  up.ipv4 = reply.switch_ipv4;
  if (up.ipv4 == 0) {
    // The upstream's data plane is where its control plane is.
    const std::string& target = options_.upstream;
    const size_t colon = target.rfind(':');
    ASSIGN_OR_RETURN(up.ipv4, transport::ResolveIpv4(target.substr(0, colon)));
  }
  up.port = reply.data_port;
  up.num_ports = reply.num_data_ports == 0 ? 1 : reply.num_data_ports;
  {
    std::lock_guard lock(sw_->mu);
    RETURN_IF_ERROR(sw_->sw.SetUpstream(request.session_id(), up));
  }
  LOG(kInfo, kControl) << "session " << request.session_id() << ": rack " << options_.rack_index
                       << " of " << options_.racks << " joined the upstream switch "
                       << options_.upstream << " (data plane "
                       << Endpoint{up.ipv4, up.port}.ToString() << ")";
  return Status::Ok();
}

void Uplink::Shutdown() {
  {
    std::lock_guard lock(mu_);
    shutting_down_ = true;
  }
  cv_.notify_all();
}

std::optional<Status> Uplink::Barrier(const switchml_proto::BarrierRequest& request) {
  return sync_client_.Barrier(request.session_id(), request.num_workers());
}

std::optional<Result<uint64_t>> Uplink::Broadcast(const switchml_proto::BroadcastRequest& request) {
  return sync_client_.Broadcast(request.session_id(), request.value(), request.rank(),
                                request.num_workers(), request.root());
}

}  // namespace switchml::runtime
