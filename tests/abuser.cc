// switchml_abuser: a stranger on a switch's control port, for scripts/soak.py --abuse (not a test
// by itself). Cycles through the abuses of issue 28 in bounded loops on loopback, each for
// --phase-seconds, until --seconds have passed, and prints one line per phase with what the
// switch answered:
//   conn     found 1: idle TCP connections from 127.66.x.y that never send a byte (as many as
//            --connections), held for the phase;
//   barrier  found 4: from 70 source addresses (127.67.0.x), 240 waiting Barrier calls each
//            (sessions of their own), held for the phase;
//   tor      found 5: a top-of-rack switch process in front of the switch, and 300 barriers sent
//            to it from one address; reports the ToR's threads;
//   jobs     found 6: jobs of the stranger's own, one from each of 64 source addresses
//            (127.68.0.x), each kept alive by an Attach stream; and 20,000 Attach streams that
//            never send a message, from one address;
//   anyport  found 7: a registration with udp_port 0 from 127.0.0.1 (the soak workers' address).
// Usage: switchml_abuser --switch HOST:PORT --switchml PATH [--seconds S] [--phase-seconds P]
//                        [--connections N]
#include <arpa/inet.h>
#include <grpcpp/create_channel_posix.h>
#include <grpcpp/grpcpp.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "control/switchml.grpc.pb.h"
#include "control/switchml.pb.h"
#include "testing/tcp.h"

namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

std::string g_host = "127.0.0.1";
uint16_t g_port = 0;
std::string g_switchml;

using switchml::testing::ConnectFrom;

// A gRPC channel over a connection from `source`.
std::shared_ptr<grpc::Channel> ChannelFrom(uint32_t source, uint16_t port) {
  const int fd = ConnectFrom(source, port, /*blocking=*/true);
  if (fd < 0) return nullptr;
  return grpc::CreateInsecureChannelFromFd("switch", fd);
}

struct Outcomes {
  std::mutex mu;
  std::map<std::string, int> codes;
  void Add(const grpc::Status& s) {
    std::lock_guard lock(mu);
    ++codes[std::to_string(s.error_code())];
  }
  std::string Text() {
    std::lock_guard lock(mu);
    std::string t;
    for (const auto& [c, n] : codes) t += (t.empty() ? "" : ",") + c + ":" + std::to_string(n);
    return t.empty() ? "-" : t;
  }
};

// Async barriers; each ends at its deadline, or cancelled.
struct Waiting {
  grpc::ClientContext ctx;
  switchml_proto::BarrierRequest req;
  switchml_proto::BarrierResponse resp;
  std::atomic<bool> done{false};
};

void WaitAll(std::vector<std::unique_ptr<Waiting>>& calls) {
  for (auto& w : calls) w->ctx.TryCancel();
  for (auto& w : calls) {
    while (!w->done) std::this_thread::sleep_for(1ms);
  }
}

void PhaseConnections(int n, std::chrono::seconds hold) {
  std::vector<int> fds;
  for (int i = 0; i < n; ++i) {
    const int fd = ConnectFrom(
        0x7f420000u | static_cast<uint32_t>(((i / 250) << 8) | (i % 250 + 1)), g_port, false);
    if (fd >= 0) fds.push_back(fd);
  }
  std::this_thread::sleep_for(hold);
  for (int fd : fds) close(fd);
  std::printf("abuse conn: %zu idle connections from 127.66.x.y held %lld s\n", fds.size(),
              static_cast<long long>(hold.count()));
}

void PhaseBarriers(std::chrono::seconds hold) {
  Outcomes out;
  std::vector<std::shared_ptr<grpc::Channel>> channels;
  std::vector<std::unique_ptr<switchml_proto::Sync::Stub>> stubs;
  std::vector<std::unique_ptr<Waiting>> calls;
  for (uint32_t a = 0; a < 70; ++a) {
    auto ch = ChannelFrom(0x7f430001u + a, g_port);
    if (!ch) continue;
    stubs.push_back(switchml_proto::Sync::NewStub(ch));
    channels.push_back(ch);
    for (uint32_t i = 0; i < 240; ++i) {
      auto w = std::make_unique<Waiting>();
      w->req.set_session_id(1000000 + a * 1000 + i);
      w->req.set_num_workers(32);
      w->req.set_job_secret("abuser");
      w->ctx.set_deadline(std::chrono::system_clock::now() + hold);
      Waiting* p = w.get();
      stubs.back()->async()->Barrier(&p->ctx, &p->req, &p->resp, [p, &out](grpc::Status s) {
        out.Add(s);
        p->done = true;
      });
      calls.push_back(std::move(w));
    }
  }
  std::this_thread::sleep_for(hold);
  WaitAll(calls);
  std::printf("abuse barrier: %zu barriers from %zu addresses; answers (code:count) %s\n",
              calls.size(), channels.size(), out.Text().c_str());
}

int Threads(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("Threads:", 0) == 0) return std::stoi(line.substr(8));
  }
  return -1;
}

void PhaseTor(std::chrono::seconds hold) {
  // A top-of-rack switch of this stranger's, in front of the switch.
  const uint16_t tor_port = static_cast<uint16_t>(g_port + 7);
  const pid_t pid = fork();
  if (pid == 0) {
    const std::string up = g_host + ":" + std::to_string(g_port);
    const std::string cp = std::to_string(tor_port);
    execl(g_switchml.c_str(), g_switchml.c_str(), "switch", "--bind", "127.0.0.1", "--control-port",
          cp.c_str(), "--data-port", "0", "--upstream", up.c_str(), "--racks", "1", "--rack-index",
          "0", "--log-level", "error", static_cast<char*>(nullptr));
    _exit(127);
  }
  std::this_thread::sleep_for(1500ms);
  Outcomes out;
  auto ch = ChannelFrom(0x7f440001u, tor_port);
  std::vector<std::unique_ptr<Waiting>> calls;
  int max_threads = 0;
  if (ch) {
    auto stub = switchml_proto::Sync::NewStub(ch);
    for (int i = 0; i < 300; ++i) {
      auto w = std::make_unique<Waiting>();
      w->req.set_session_id(2000000 + i);
      w->req.set_num_workers(32);
      w->ctx.set_deadline(std::chrono::system_clock::now() + hold);
      Waiting* p = w.get();
      stub->async()->Barrier(&p->ctx, &p->req, &p->resp, [p, &out](grpc::Status s) {
        out.Add(s);
        p->done = true;
      });
      calls.push_back(std::move(w));
    }
    const auto end = Clock::now() + hold;
    while (Clock::now() < end) {
      max_threads = std::max(max_threads, Threads(pid));
      std::this_thread::sleep_for(200ms);
    }
    WaitAll(calls);
  }
  kill(pid, SIGTERM);
  waitpid(pid, nullptr, 0);
  std::printf(
      "abuse tor: 300 barriers to a top-of-rack switch; its threads at most %d; answers %s\n",
      max_threads, out.Text().c_str());
}

struct Stream {
  grpc::ClientContext ctx;
  std::unique_ptr<
      grpc::ClientReaderWriter<switchml_proto::AttachRequest, switchml_proto::AttachEvent>>
      rw;
};

void PhaseJobs(std::chrono::seconds hold) {
  Outcomes reg;
  std::vector<std::shared_ptr<grpc::Channel>> channels;
  std::vector<std::unique_ptr<Stream>> streams;
  int created = 0;
  for (uint32_t a = 0; a < 64; ++a) {
    const uint32_t source = 0x7f440101u + a;
    auto ch = ChannelFrom(source, g_port);
    if (!ch) continue;
    channels.push_back(ch);
    auto session = switchml_proto::Session::NewStub(ch);
    switchml_proto::UdpSessionRequest r;
    r.set_session_id(3000000 + a);
    r.set_num_workers(1);
    r.set_packet_size(switchml_proto::PacketSize::MTU_1024);
    r.set_udp_port(41000 + a);
    r.set_running_tsi(true);
    r.set_job_secret("abuser");
    switchml_proto::UdpSessionResponse resp;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + 5s);
    const grpc::Status st = session->UdpSession(&ctx, r, &resp);
    reg.Add(st);
    if (!st.ok()) continue;
    ++created;
    auto s = std::make_unique<Stream>();
    s->rw = session->Attach(&s->ctx);
    switchml_proto::AttachRequest first;
    first.set_session_id(r.session_id());
    first.set_job_secret("abuser");
    s->rw->Write(first);
    streams.push_back(std::move(s));
  }
  // 20,000 streams that never send a message, from one address.
  auto one = ChannelFrom(0x7f440201u, g_port);
  std::vector<std::unique_ptr<Stream>> silent;
  if (one) {
    auto session = switchml_proto::Session::NewStub(one);
    for (int i = 0; i < 20000; ++i) {
      auto s = std::make_unique<Stream>();
      s->rw = session->Attach(&s->ctx);
      silent.push_back(std::move(s));
    }
  }
  std::this_thread::sleep_for(hold);
  for (auto* v : {&streams, &silent}) {
    for (auto& s : *v) s->ctx.TryCancel();
    for (auto& s : *v) (void)s->rw->Finish();
  }
  std::printf(
      "abuse jobs: %d of 64 jobs created from 64 addresses, each with a stream "
      "(registrations %s); 20000 silent streams from one address\n",
      created, reg.Text().c_str());
}

void PhaseAnyPort(std::chrono::seconds hold) {
  auto ch = ChannelFrom(0x7f000001u, g_port);
  std::string outcome = "no connection";
  std::unique_ptr<Stream> s;
  if (ch) {
    auto session = switchml_proto::Session::NewStub(ch);
    switchml_proto::UdpSessionRequest r;
    r.set_session_id(4000000);
    r.set_num_workers(1);
    r.set_packet_size(switchml_proto::PacketSize::MTU_1024);
    r.set_udp_port(0);  // any port of 127.0.0.1
    r.set_job_secret("abuser");
    switchml_proto::UdpSessionResponse resp;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + 5s);
    const grpc::Status st = session->UdpSession(&ctx, r, &resp);
    outcome = st.ok() ? "registered" : "refused " + std::to_string(st.error_code());
    if (st.ok()) {
      s = std::make_unique<Stream>();
      s->rw = session->Attach(&s->ctx);
      switchml_proto::AttachRequest first;
      first.set_session_id(4000000);
      first.set_job_secret("abuser");
      s->rw->Write(first);
    }
  }
  std::this_thread::sleep_for(hold);
  if (s) {
    s->ctx.TryCancel();
    (void)s->rw->Finish();
  }
  std::printf("abuse anyport: udp_port 0 from 127.0.0.1: %s, held %lld s\n", outcome.c_str(),
              static_cast<long long>(hold.count()));
}

}  // namespace

int main(int argc, char** argv) {
  int seconds = 600, phase = 30, connections = 3000;
  std::string target;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--switch")
      target = v;
    else if (k == "--switchml")
      g_switchml = v;
    else if (k == "--seconds")
      seconds = std::stoi(v);
    else if (k == "--phase-seconds")
      phase = std::stoi(v);
    else if (k == "--connections")
      connections = std::stoi(v);
  }
  const size_t colon = target.rfind(':');
  if (colon == std::string::npos || g_switchml.empty()) {
    std::fprintf(stderr,
                 "usage: switchml_abuser --switch HOST:PORT --switchml PATH [--seconds S] "
                 "[--phase-seconds P] [--connections N]\n");
    return 2;
  }
  g_host = target.substr(0, colon);
  g_port = static_cast<uint16_t>(std::stoi(target.substr(colon + 1)));
  rlimit r{};
  getrlimit(RLIMIT_NOFILE, &r);
  r.rlim_cur = r.rlim_max;
  setrlimit(RLIMIT_NOFILE, &r);
  signal(SIGPIPE, SIG_IGN);
  const auto end = Clock::now() + std::chrono::seconds(seconds);
  const std::chrono::seconds hold(std::max(1, phase - 2));
  static const char* const kNames[] = {"conn", "barrier", "tor", "jobs", "anyport"};
  for (int k = 0; Clock::now() + std::chrono::seconds(phase) <= end; ++k) {
    std::printf("phase %s: start\n", kNames[k % 5]);
    std::fflush(stdout);
    switch (k % 5) {
      case 0:
        PhaseConnections(connections, hold);
        break;
      case 1:
        PhaseBarriers(hold);
        break;
      case 2:
        PhaseTor(hold);
        break;
      case 3:
        PhaseJobs(hold);
        break;
      case 4:
        PhaseAnyPort(hold);
        break;
    }
    std::fflush(stdout);
    std::this_thread::sleep_for(2s);
  }
  return 0;
}
