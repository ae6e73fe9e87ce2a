// Fuzzes the control plane's request handling through gRPC (registry_fuzz fuzzes the Registry's
// rules alone): a ControlServer in this process, on a loopback port behind its own listener, and
// arbitrary sequences of calls over two connections. Every unary method (Monitor.Status too, and
// one that does not exist) with arbitrary bytes as its request, so that protobuf's parsing of
// hostile input and the handlers' checks run; and well-formed requests of a few sessions, secrets
// and ranks: registrations, barriers and broadcasts (with and without deadlines), closes with and
// without a failure report, diagnoses, Attach streams that send nothing, a first message, reports
// or a failure, and then end or are cancelled; calls cancelled by the client.
//
// Checks: no crash or sanitizer report; every call ends (cancelled at the end of the input at
// the latest) with a gRPC status; once every call and stream of an input ended, the server holds
// nothing for them: no waiting call, attached or pending stream, call counted against a
// stranger or a job, within 5 s; the server still answers (a Close of a session that does not
// exist is NOT_FOUND); and the jobs the input made can be closed by their secret's owner.
#include <fuzzer/FuzzedDataProvider.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "control/control_server.h"
#include "control/switchml.grpc.pb.h"
#include "control/switchml.pb.h"
#include "dataplane/switch.h"
#include "fuzz_check.h"

namespace switchml::control {
namespace {

using namespace std::chrono_literals;

constexpr uint64_t kSessions[] = {1, 2, 3, 0};
const char* const kSecrets[] = {"", "alpha", "bravo"};
const char* const kMethods[] = {
    "/switchml_proto.Session/UdpSession", "/switchml_proto.Session/Close",
    "/switchml_proto.Session/Diagnose",   "/switchml_proto.Session/RdmaSession",
    "/switchml_proto.Sync/Barrier",       "/switchml_proto.Sync/Broadcast",
    "/switchml_proto.Session/Nope",       "/switchml_proto.Monitor/Status"};

struct Server {
  dataplane::LockedSwitch sw{[] {
    dataplane::SwitchConfig c;
    c.max_jobs = 4;
    c.max_workers_per_job = 8;
    c.slots_per_job = 256;
    return c;
  }()};
  std::unique_ptr<ControlServer> server;
  std::shared_ptr<grpc::Channel> channels[2];
  std::unique_ptr<grpc::GenericStub> generic[2];
  std::unique_ptr<switchml_proto::Session::Stub> session[2];

  Server() {
    ControlServerOptions o;
    o.bind_address = "127.0.0.1";
    o.port = 0;
    o.registry.max_calls_per_client = 24;
    o.registry.max_calls_total = 32;
    o.registry.attach_grace = 0ms;
    o.registry.lease = 1000ms;
    auto s = ControlServer::Start(o, &sw);
    FUZZ_CHECK(s.ok());
    server = std::move(s).value();
    for (int c = 0; c < 2; ++c) {
      grpc::ChannelArguments args;
      args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);  // a connection of its own
      args.SetInt(GRPC_ARG_ENABLE_HTTP_PROXY, 0);
      channels[c] = grpc::CreateCustomChannel("127.0.0.1:" + std::to_string(server->port()),
                                              grpc::InsecureChannelCredentials(), args);
      generic[c] = std::make_unique<grpc::GenericStub>(channels[c]);
      session[c] = switchml_proto::Session::NewStub(channels[c]);
    }
  }
};

Server& TheServer() {
  static Server* s = new Server();  // lives for the fuzzer's run
  return *s;
}

grpc::ByteBuffer Bytes(const std::string& s) {
  grpc::Slice slice(s);
  return grpc::ByteBuffer(&slice, 1);
}

struct Unary {
  grpc::ClientContext ctx;
  grpc::ByteBuffer request, response;
  std::atomic<bool> done{false};
};

struct Stream {
  grpc::ClientContext ctx;
  std::unique_ptr<
      grpc::ClientReaderWriter<switchml_proto::AttachRequest, switchml_proto::AttachEvent>>
      rw;
  bool open = true;
};

std::string Secret(FuzzedDataProvider& in) { return kSecrets[in.ConsumeIntegralInRange(0, 2)]; }
uint64_t Session(FuzzedDataProvider& in) { return kSessions[in.ConsumeIntegralInRange(0, 3)]; }

// A well-formed request of `method` (its index in kMethods) with fuzzed fields.
std::string WellFormed(int method, FuzzedDataProvider& in) {
  switch (method) {
    case 0: {
      switchml_proto::UdpSessionRequest r;
      r.set_session_id(Session(in));
      r.set_rank(in.ConsumeIntegralInRange<uint32_t>(0, 4));
      r.set_num_workers(in.ConsumeIntegralInRange<uint32_t>(0, 4));
      r.set_ipv4(in.ConsumeBool() ? 0 : 0x7f000001);
      r.set_packet_size(static_cast<switchml_proto::PacketSize>(in.ConsumeIntegralInRange(0, 3)));
      r.set_udp_port(in.ConsumeBool() ? 0 : 40000 + in.ConsumeIntegralInRange(0, 8));
      r.set_num_udp_ports(in.ConsumeIntegralInRange<uint32_t>(0, 2));
      r.set_max_outstanding_packets(in.ConsumeIntegralInRange<uint32_t>(0, 300));
      r.set_running_tsi(in.ConsumeBool());
      r.set_job_secret(Secret(in));
      r.set_authenticate_data(in.ConsumeBool());
      if (in.ConsumeBool()) {
        r.set_multicast_group_ipv4(0xefc00001);
        r.set_multicast_group_port(50000);
      }
      return r.SerializeAsString();
    }
    case 1: {
      switchml_proto::CloseRequest r;
      r.set_session_id(Session(in));
      r.set_job_secret(Secret(in));
      if (in.ConsumeBool()) r.set_rank(in.ConsumeIntegralInRange<uint32_t>(0, 4));
      if (in.ConsumeBool()) r.set_failure(in.ConsumeRandomLengthString(64));
      return r.SerializeAsString();
    }
    case 2: {
      switchml_proto::DiagnoseRequest r;
      r.set_session_id(Session(in));
      r.set_job_secret(Secret(in));
      r.set_op(in.ConsumeIntegralInRange<uint64_t>(0, 3));
      return r.SerializeAsString();
    }
    case 4: {
      switchml_proto::BarrierRequest r;
      r.set_session_id(Session(in));
      r.set_num_workers(in.ConsumeIntegralInRange<uint32_t>(0, 4));
      if (in.ConsumeBool()) r.set_rank(in.ConsumeIntegralInRange<uint32_t>(0, 4));
      r.set_job_secret(Secret(in));
      return r.SerializeAsString();
    }
    case 7: {
      switchml_proto::StatusRequest r;
      r.set_job_secret(Secret(in));
      return r.SerializeAsString();
    }
    case 5: {
      switchml_proto::BroadcastRequest r;
      r.set_session_id(Session(in));
      r.set_num_workers(in.ConsumeIntegralInRange<uint32_t>(0, 4));
      r.set_rank(in.ConsumeIntegralInRange<uint32_t>(0, 4));
      r.set_root(in.ConsumeIntegralInRange<uint32_t>(0, 4));
      r.set_value(in.ConsumeIntegral<uint64_t>());
      r.set_job_secret(Secret(in));
      return r.SerializeAsString();
    }
    default:
      return in.ConsumeRandomLengthString(64);
  }
}

bool WaitFor(const std::function<bool()>& done, std::chrono::milliseconds limit) {
  const auto end = std::chrono::steady_clock::now() + limit;
  while (!done()) {
    if (std::chrono::steady_clock::now() > end) return false;
    std::this_thread::sleep_for(1ms);
  }
  return true;
}

}  // namespace
}  // namespace switchml::control

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace switchml;
  using namespace switchml::control;
  Server& s = TheServer();
  FuzzedDataProvider in(data, size);
  std::vector<std::unique_ptr<Unary>> calls;
  std::vector<std::unique_ptr<Stream>> streams;
  int ops = 0;
  while (in.remaining_bytes() > 0 && ops++ < 64) {
    const int c = in.ConsumeIntegralInRange(0, 1);  // which connection
    switch (in.ConsumeIntegralInRange(0, 7)) {
      case 0:
      case 1: {  // a unary call: well-formed, or arbitrary bytes
        const int method = in.ConsumeIntegralInRange(0, 7);
        const bool raw = in.ConsumeBool();
        auto u = std::make_unique<Unary>();
        u->request = Bytes(raw ? in.ConsumeRandomLengthString(512) : WellFormed(method, in));
        if (in.ConsumeBool()) {
          u->ctx.set_deadline(std::chrono::system_clock::now() +
                              std::chrono::milliseconds(in.ConsumeIntegralInRange(1, 300)));
        }
        Unary* p = u.get();
        s.generic[c]->UnaryCall(&p->ctx, kMethods[method], grpc::StubOptions(), &p->request,
                                &p->response, [p](grpc::Status) { p->done = true; });
        calls.push_back(std::move(u));
        break;
      }
      case 2: {  // a stream opens (and may send nothing)
        auto st = std::make_unique<Stream>();
        st->rw = s.session[c]->Attach(&st->ctx);
        streams.push_back(std::move(st));
        break;
      }
      case 3:  // a stream's next message: its first (attach), a report or a failure
        if (!streams.empty()) {
          Stream& st = *streams[in.ConsumeIntegralInRange<size_t>(0, streams.size() - 1)];
          if (!st.open) break;
          switchml_proto::AttachRequest r;
          r.set_session_id(Session(in));
          r.set_rank(in.ConsumeIntegralInRange<uint32_t>(0, 4));
          r.set_job_secret(Secret(in));
          r.set_op(in.ConsumeIntegralInRange<uint64_t>(0, 3));
          r.set_count(in.ConsumeIntegralInRange<uint64_t>(0, 3));
          r.set_dtype(in.ConsumeIntegralInRange<uint32_t>(0, 3));
          if (in.ConsumeBool()) r.set_member(in.ConsumeRandomLengthString(32));
          if (in.ConsumeBool()) r.set_failure(in.ConsumeRandomLengthString(32));
          if (!st.rw->Write(r)) st.open = false;  // the server ended it
        }
        break;
      case 4:  // a stream ends: the worker closes its side, or goes away
        if (!streams.empty()) {
          Stream& st = *streams[in.ConsumeIntegralInRange<size_t>(0, streams.size() - 1)];
          if (!st.open) break;
          if (in.ConsumeBool()) {
            st.rw->WritesDone();
          } else {
            st.ctx.TryCancel();
          }
          st.open = false;
        }
        break;
      case 5:  // a call is cancelled by its client
        if (!calls.empty())
          calls[in.ConsumeIntegralInRange<size_t>(0, calls.size() - 1)]->ctx.TryCancel();
        break;
      case 6:  // time passes (leases, first-message timeouts, deadlines)
        std::this_thread::sleep_for(std::chrono::milliseconds(in.ConsumeIntegralInRange(0, 20)));
        break;
      case 7: {  // a well-formed registration and barrier pair, as a worker's setup
        auto u = std::make_unique<Unary>();
        u->request = Bytes(WellFormed(0, in));
        Unary* p = u.get();
        s.generic[c]->UnaryCall(&p->ctx, kMethods[0], grpc::StubOptions(), &p->request,
                                &p->response, [p](grpc::Status) { p->done = true; });
        calls.push_back(std::move(u));
        break;
      }
    }
  }
  // The end: every call and stream is cancelled by its client (or has ended).
  for (auto& u : calls) u->ctx.TryCancel();
  for (auto& st : streams) st->ctx.TryCancel();
  FUZZ_CHECK(WaitFor(
      [&] {
        for (auto& u : calls) {
          if (!u->done) return false;
        }
        return true;
      },
      10s));
  for (auto& st : streams) (void)st->rw->Finish();
  // Nothing stays held for calls that ended.
  Registry& reg = s.server->registry();
  FUZZ_CHECK(WaitFor(
      [&] {
        return reg.counts().waiting_calls == 0 && reg.counts().attached_streams == 0 &&
               reg.counts().pending_streams == 0 && reg.counts().stranger_calls == 0 &&
               reg.counts().forwarded_calls == 0 && reg.counts(1).member_calls == 0 &&
               reg.counts(2).member_calls == 0 && reg.counts(3).member_calls == 0;
      },
      5s));
  // The server answers, and the input's jobs are closed by their owners. A registration whose
  // client cancelled it may still be handled after that (the client's cancellation completes at
  // once, the server's handler runs on): it creates its job then, so the owners close again
  // until every job is gone.
  const auto close_all = [&] {
    for (uint64_t id : {1, 2, 3}) {
      for (const char* secret : kSecrets) {
        grpc::ClientContext ctx;
        ctx.set_deadline(std::chrono::system_clock::now() + 5s);
        switchml_proto::CloseRequest r;
        r.set_session_id(id);
        r.set_job_secret(secret);
        switchml_proto::CloseResponse resp;
        const grpc::Status st = s.session[0]->Close(&ctx, r, &resp);
        FUZZ_CHECK(st.error_code() == grpc::StatusCode::OK ||
                   st.error_code() == grpc::StatusCode::NOT_FOUND);
      }
    }
    return !reg.HasJob(1) && !reg.HasJob(2) && !reg.HasJob(3);
  };
  FUZZ_CHECK(WaitFor(close_all, 5s));
  return 0;
}
