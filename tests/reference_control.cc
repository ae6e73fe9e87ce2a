#include "reference_control.h"

#include <grpcpp/grpcpp.h>

#include <atomic>

#include "control/switchml.grpc.pb.h"
#include "control/switchml.pb.h"

namespace switchml::testing {
namespace {

class ReferenceLikeSession final : public switchml_proto::Session::Service {
 public:
  grpc::Status UdpSession(grpc::ServerContext*, const switchml_proto::UdpSessionRequest* request,
                          switchml_proto::UdpSessionResponse* response) override {
    response->set_session_id(request->session_id());
    calls.fetch_add(1);
    return grpc::Status::OK;
  }
  std::atomic<int> calls{0};
};

}  // namespace

struct ReferenceLikeControl::Impl {
  ReferenceLikeSession session;
  std::unique_ptr<grpc::Server> server;
  int port = 0;
};

ReferenceLikeControl::ReferenceLikeControl() : impl_(std::make_unique<Impl>()) {}

ReferenceLikeControl::~ReferenceLikeControl() {
  if (impl_->server) impl_->server->Shutdown();
}

std::unique_ptr<ReferenceLikeControl> ReferenceLikeControl::Start() {
  std::unique_ptr<ReferenceLikeControl> c(new ReferenceLikeControl());
  grpc::ServerBuilder builder;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &c->impl_->port);
  builder.RegisterService(&c->impl_->session);
  c->impl_->server = builder.BuildAndStart();
  if (c->impl_->server == nullptr || c->impl_->port <= 0) return nullptr;
  return c;
}

uint16_t ReferenceLikeControl::port() const { return static_cast<uint16_t>(impl_->port); }

int ReferenceLikeControl::udp_sessions() const { return impl_->session.calls.load(); }

}  // namespace switchml::testing
