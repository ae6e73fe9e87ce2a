#include "control/control_client.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <utility>

#include "base/status_macros.h"
#include "control/switchml.grpc.pb.h"
#include "control/switchml.pb.h"

namespace switchml::control {
namespace {

// Reconnect quickly while waiting for a switch that starts after the worker.
constexpr int kReconnectBackoffMs = 100;
constexpr int kMaxReconnectBackoffMs = 1000;

StatusCode FromGrpcCode(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::OK:
      return StatusCode::kOk;
    case grpc::StatusCode::CANCELLED:
      return StatusCode::kCancelled;
    case grpc::StatusCode::INVALID_ARGUMENT:
      return StatusCode::kInvalidArgument;
    case grpc::StatusCode::OUT_OF_RANGE:
      return StatusCode::kInvalidArgument;
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return StatusCode::kDeadlineExceeded;
    case grpc::StatusCode::NOT_FOUND:
      return StatusCode::kNotFound;
    case grpc::StatusCode::ALREADY_EXISTS:
      return StatusCode::kAlreadyExists;
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
      return StatusCode::kResourceExhausted;
    case grpc::StatusCode::FAILED_PRECONDITION:
      return StatusCode::kFailedPrecondition;
    case grpc::StatusCode::ABORTED:
      return StatusCode::kFailedPrecondition;
    case grpc::StatusCode::UNIMPLEMENTED:
      return StatusCode::kUnimplemented;
    case grpc::StatusCode::UNAVAILABLE:
      return StatusCode::kUnavailable;
    default:
      return StatusCode::kInternal;
  }
}

// "30 s", "1.5 s", "200 ms".
std::string FormatTimeout(std::chrono::milliseconds t) {
  const auto ms = t.count();
  if (ms < 1000) return std::to_string(ms) + " ms";
  if (ms % 1000 == 0) return std::to_string(ms / 1000) + " s";
  std::string frac = std::to_string(ms % 1000);
  frac.insert(0, 3 - frac.size(), '0');
  while (frac.back() == '0') frac.pop_back();
  return std::to_string(ms / 1000) + "." + frac + " s";
}

}  // namespace

struct ControlClient::Impl {
  std::string target;
  std::chrono::milliseconds timeout;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<switchml_proto::Session::Stub> session;
  std::unique_ptr<switchml_proto::Sync::Stub> sync;

  void Prepare(grpc::ClientContext* ctx) const {
    ctx->set_wait_for_ready(true);
    ctx->set_deadline(std::chrono::system_clock::now() + timeout);
  }

  std::string Unreachable() const {
    return "switch control plane at " + target + " did not answer within " +
           FormatTimeout(timeout) +
           ": is `switchml switch` running there, and is --control-port right?";
  }

  // Maps a gRPC status to ours. `sync_what` names a Barrier/Broadcast ("barrier of session 77
  // (4 workers)") whose deadline means a missing peer when the switch itself was reachable.
  Status Convert(const grpc::Status& s, const std::string& sync_what) const {
    if (s.ok()) return Status::Ok();
    switch (s.error_code()) {
      case grpc::StatusCode::DEADLINE_EXCEEDED:
        if (!sync_what.empty() && channel->GetState(false) == GRPC_CHANNEL_READY) {
          return DeadlineExceededError(
              sync_what + " timed out after " + FormatTimeout(timeout) +
              ": a peer worker did not arrive (did it fail or start with other arguments?)");
        }
        return DeadlineExceededError(Unreachable());
      case grpc::StatusCode::UNAVAILABLE:
        return UnavailableError("switch control plane at " + target +
                                " is unavailable: " + s.error_message());
      default:
        return Status(FromGrpcCode(s.error_code()), s.error_message());
    }
  }
};

ControlClient::ControlClient(std::string target, std::chrono::milliseconds timeout)
    : impl_(std::make_unique<Impl>()) {
  impl_->target = std::move(target);
  impl_->timeout = timeout;
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_ENABLE_HTTP_PROXY, 0);
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, kReconnectBackoffMs);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, kReconnectBackoffMs);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, kMaxReconnectBackoffMs);
  impl_->channel =
      grpc::CreateCustomChannel(impl_->target, grpc::InsecureChannelCredentials(), args);
  impl_->session = switchml_proto::Session::NewStub(impl_->channel);
  impl_->sync = switchml_proto::Sync::NewStub(impl_->channel);
}

ControlClient::~ControlClient() = default;
ControlClient::ControlClient(ControlClient&&) noexcept = default;
ControlClient& ControlClient::operator=(ControlClient&&) noexcept = default;

const std::string& ControlClient::target() const { return impl_->target; }

Result<UdpSessionReply> ControlClient::UdpSession(const UdpSessionArgs& args) {
  switchml_proto::UdpSessionRequest req;
  req.set_session_id(args.session_id);
  req.set_rank(args.rank);
  req.set_num_workers(args.num_workers);
  req.set_ipv4(args.ipv4);
  req.set_packet_size(static_cast<switchml_proto::PacketSize>(args.size));
  req.set_udp_port(args.udp_port);
  req.set_num_udp_ports(args.num_udp_ports);
  req.set_max_outstanding_packets(args.max_outstanding_packets);
  req.set_running_tsi(args.running_tsi);
  switchml_proto::UdpSessionResponse resp;
  grpc::ClientContext ctx;
  impl_->Prepare(&ctx);
  RETURN_IF_ERROR(impl_->Convert(impl_->session->UdpSession(&ctx, req, &resp), ""));
  UdpSessionReply reply;
  reply.session_id = resp.session_id();
  reply.switch_ipv4 = resp.ipv4();
  // A reference controller does not send the extension fields: its data port is the default.
  reply.data_port =
      resp.udp_port() == 0 ? proto::kDefaultDataPort : static_cast<uint16_t>(resp.udp_port());
  reply.max_workers = resp.max_workers();
  reply.num_slots = resp.num_slots();
  reply.num_data_ports = std::max<uint32_t>(1, resp.num_data_ports());
  if (resp.udp_port() > 65535 || uint64_t{reply.data_port} + reply.num_data_ports - 1 > 65535) {
    return InternalError("switch control plane at " + impl_->target +
                         " answered with invalid data ports " + std::to_string(resp.udp_port()) +
                         " (" + std::to_string(reply.num_data_ports) + " of them)");
  }
  return reply;
}

Status ControlClient::Barrier(uint64_t session_id, uint32_t num_workers) {
  switchml_proto::BarrierRequest req;
  req.set_session_id(session_id);
  req.set_num_workers(num_workers);
  switchml_proto::BarrierResponse resp;
  grpc::ClientContext ctx;
  impl_->Prepare(&ctx);
  const std::string what = (session_id == 0 ? std::string("unscoped barrier")
                                            : "barrier of session " + std::to_string(session_id)) +
                           " (" + std::to_string(num_workers) + " workers)";
  return impl_->Convert(impl_->sync->Barrier(&ctx, req, &resp), what);
}

Result<uint64_t> ControlClient::Broadcast(uint64_t session_id, uint64_t value, uint32_t rank,
                                          uint32_t num_workers, uint32_t root) {
  switchml_proto::BroadcastRequest req;
  req.set_session_id(session_id);
  req.set_value(value);
  req.set_rank(rank);
  req.set_num_workers(num_workers);
  req.set_root(root);
  switchml_proto::BroadcastResponse resp;
  grpc::ClientContext ctx;
  impl_->Prepare(&ctx);
  const std::string what =
      (session_id == 0 ? std::string("unscoped broadcast")
                       : "broadcast of session " + std::to_string(session_id)) +
      " (" + std::to_string(num_workers) + " workers, root " + std::to_string(root) + ")";
  RETURN_IF_ERROR(impl_->Convert(impl_->sync->Broadcast(&ctx, req, &resp), what));
  return resp.value();
}

}  // namespace switchml::control
