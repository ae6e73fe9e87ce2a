// `switchml status HOST[:PORT]`: what a switch is doing now, from its control plane's read-only
// Monitor.Status call (control/status_service.h): its threads and their load, the jobs the
// caller may see with their workers, progress and rates, the other jobs as a count, and the
// control plane's refusals. Rates are the change between two answers `--interval` apart.
#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "commands.h"
#include "control/switchml.grpc.pb.h"
#include "control/switchml.pb.h"
#include "control/tls_files.h"
#include "flags.h"
#include "proto/wire.h"
#include "transport/address.h"

namespace switchml::tools {
namespace {

struct Target {
  std::string address;  // host:port
  std::shared_ptr<grpc::ChannelCredentials> credentials;
  std::string server_name;
  std::string secret;
  std::chrono::milliseconds timeout{5000};
};

// The command's flags as given (DefineStatusFlags binds them).
struct StatusFlags {
  std::string switches;  // --switch
  bool json = false;
  bool watch = false;
  double interval = 1;
  int64_t count = 0;
  std::string job_secret;
  TlsClientFlags tls;
  int64_t timeout_ms = 5000;
  std::string log_level = "warning";
};

Result<std::shared_ptr<grpc::ChannelCredentials>> Credentials(const TlsClientFlags& tls) {
  const std::string &ca = tls.ca, &cert = tls.cert, &key = tls.key;
  if (ca.empty()) {
    if (!cert.empty() || !key.empty()) {
      return InvalidArgumentError("a TLS client certificate needs the CA file too (--tls-ca)");
    }
    return grpc::InsecureChannelCredentials();
  }
  if (cert.empty() != key.empty()) {
    return InvalidArgumentError("a TLS client certificate needs its key (--tls-cert, --tls-key)");
  }
  grpc::SslCredentialsOptions ssl;
  auto root = control::ReadTlsPem(ca, "CA file");
  if (!root.ok()) return root.status();
  ssl.pem_root_certs = *root;
  if (!cert.empty()) {
    auto c = control::ReadTlsPem(cert, "certificate");
    if (!c.ok()) return c.status();
    auto k = control::ReadTlsPem(key, "key");
    if (!k.ok()) return k.status();
    ssl.pem_cert_chain = *c;
    ssl.pem_private_key = *k;
  }
  return grpc::SslCredentials(ssl);
}

class StatusClient {
 public:
  explicit StatusClient(const Target& t) : target_(t) {
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_ENABLE_HTTP_PROXY, 0);
    if (!t.server_name.empty()) args.SetSslTargetNameOverride(t.server_name);
    stub_ =
        switchml_proto::Monitor::NewStub(grpc::CreateCustomChannel(t.address, t.credentials, args));
  }
  Result<switchml_proto::StatusResponse> Fetch() {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + target_.timeout);
    switchml_proto::StatusRequest req;
    req.set_job_secret(target_.secret);
    switchml_proto::StatusResponse resp;
    grpc::Status st = stub_->Status(&ctx, req, &resp);
    if (st.ok()) return resp;
    std::string why = st.error_message();
    switch (st.error_code()) {
      case grpc::StatusCode::UNIMPLEMENTED:
        return UnimplementedError("the switch at " + target_.address +
                                  " has no status call (an older or a reference switch)");
      case grpc::StatusCode::PERMISSION_DENIED:
        return PermissionDeniedError(why);
      case grpc::StatusCode::DEADLINE_EXCEEDED:
      case grpc::StatusCode::UNAVAILABLE:
        return UnavailableError("no answer from a switch at " + target_.address + " within " +
                                std::to_string(target_.timeout.count()) +
                                " ms (is `switchml switch` running there, on that control port, "
                                "with TLS only if you gave --tls-ca?): " +
                                why);
      default:
        return Status(StatusCode::kInternal, "status call to " + target_.address + ": " + why);
    }
  }

 private:
  Target target_;
  std::unique_ptr<switchml_proto::Monitor::Stub> stub_;
};

// What changed between two answers, per second (empty before the second answer).
struct Rates {
  double seconds = 0;
  std::map<uint32_t, double> thread_rx, thread_tx, thread_load;  // by port
  std::map<uint64_t, double> job_elements, job_packets, job_retransmits, job_allreduces;
};

Rates RatesBetween(const switchml_proto::StatusResponse* before,
                   const switchml_proto::StatusResponse& now) {
  Rates r;
  if (before == nullptr || now.uptime_ms() <= before->uptime_ms()) return r;
  r.seconds = static_cast<double>(now.uptime_ms() - before->uptime_ms()) / 1e3;
  const auto per_s = [&](uint64_t a, uint64_t b) {
    return b >= a ? static_cast<double>(b - a) / r.seconds : 0.0;  // a counter reset: 0
  };
  std::map<uint32_t, const switchml_proto::StatusThread*> old_threads;
  for (const auto& t : before->threads()) old_threads[t.port()] = &t;
  for (const auto& t : now.threads()) {
    auto it = old_threads.find(t.port());
    if (it == old_threads.end()) continue;
    r.thread_rx[t.port()] = per_s(it->second->packets_received(), t.packets_received());
    r.thread_tx[t.port()] = per_s(it->second->packets_sent(), t.packets_sent());
    r.thread_load[t.port()] = per_s(it->second->cpu_ns(), t.cpu_ns()) / 1e9;
  }
  std::map<uint64_t, const switchml_proto::StatusJob*> old_jobs;
  for (const auto& j : before->jobs()) old_jobs[j.session_id()] = &j;
  for (const auto& j : now.jobs()) {
    auto it = old_jobs.find(j.session_id());
    if (it == old_jobs.end()) continue;
    const switchml_proto::StatusJob& o = *it->second;
    r.job_elements[j.session_id()] = per_s(o.elements_aggregated(), j.elements_aggregated());
    r.job_packets[j.session_id()] = per_s(o.packets_received(), j.packets_received());
    r.job_retransmits[j.session_id()] =
        per_s(o.retransmissions_answered(), j.retransmissions_answered());
    r.job_allreduces[j.session_id()] = per_s(o.allreduces(), j.allreduces());
  }
  return r;
}

std::string Si(double v) {
  char buf[32];
  if (v >= 1e9) {
    std::snprintf(buf, sizeof buf, "%.2fG", v / 1e9);
  } else if (v >= 1e6) {
    std::snprintf(buf, sizeof buf, "%.2fM", v / 1e6);
  } else if (v >= 1e3) {
    std::snprintf(buf, sizeof buf, "%.1fk", v / 1e3);
  } else {
    std::snprintf(buf, sizeof buf, "%.0f", v);
  }
  return buf;
}

// The largest packet size the switch takes (0, not said by a switch before the field: 256).
uint32_t MaxPacketNumel(const switchml_proto::StatusResponse& s) {
  return s.max_packet_numel() != 0 ? s.max_packet_numel() : 256;
}

std::string Duration(uint64_t ms) {
  uint64_t s = ms / 1000;
  std::ostringstream out;
  if (s >= 86400) out << s / 86400 << "d";
  if (s >= 3600) out << (s / 3600) % 24 << "h";
  if (s >= 60) out << (s / 60) % 60 << "m";
  out << s % 60 << "s";
  return out.str();
}

template <typename K>
std::string RateText(const Rates& r, const std::map<K, double>& m, K key, bool percent = false) {
  if (r.seconds <= 0) return "-";
  auto it = m.find(key);
  if (it == m.end()) return "-";
  if (percent) {
    char buf[16];
    std::snprintf(buf, sizeof buf, "%.0f%%", it->second * 100);
    return buf;
  }
  return Si(it->second);
}

void PrintText(const std::string& address, const switchml_proto::StatusResponse& s,
               const Rates& r) {
  std::printf(
      "switch %s: switchml %s, up %s, transport %s, data port%s %u%s, max %u jobs of %u "
      "slots, packets up to %u elements%s%s\n",
      address.c_str(), s.version().c_str(), Duration(s.uptime_ms()).c_str(), s.transport().c_str(),
      s.threads_size() > 1 ? "s" : "", s.data_port(),
      s.threads_size() > 1 ? ("-" + std::to_string(s.data_port() + s.threads_size() - 1)).c_str()
                           : "",
      s.max_jobs(), s.slots_per_job(), MaxPacketNumel(s), s.upstream().empty() ? "" : ", upstream ",
      s.upstream().c_str());
  std::printf("%-7s %-6s %12s %12s %7s %12s\n", "thread", "port", "received/s", "sent/s", "load",
              "dropped");
  for (int k = 0; k < s.threads_size(); ++k) {
    const auto& t = s.threads(k);
    std::printf("%-7d %-6u %12s %12s %7s %12s\n", k, t.port(),
                RateText(r, r.thread_rx, t.port()).c_str(),
                RateText(r, r.thread_tx, t.port()).c_str(),
                RateText(r, r.thread_load, t.port(), true).c_str(),
                Si(static_cast<double>(t.packets_dropped())).c_str());
  }
  std::printf("jobs: %d shown, %u other%s (not yours: counted only)\n", s.jobs_size(),
              s.other_jobs(), s.other_jobs() == 1 ? "" : "s");
  if (s.jobs_size() > 0) {
    std::printf("%-20s %-11s %8s %11s %12s %11s %10s %8s %7s\n", "job", "workers", "age",
                "all-reduces", "elements/s", "packets/s", "resends/s", "dropped", "window");
  }
  for (const auto& j : s.jobs()) {
    const std::string workers =
        std::to_string(j.workers_registered()) + "/" + std::to_string(j.num_workers()) +
        (j.workers_attached() > 0 ? " (" + std::to_string(j.workers_attached()) + "a)" : "");
    std::printf("%-20llu %-11s %8s %11llu %12s %11s %10s %8s %7u\n",
                static_cast<unsigned long long>(j.session_id()), workers.c_str(),
                Duration(j.age_ms()).c_str(), static_cast<unsigned long long>(j.allreduces()),
                RateText(r, r.job_elements, j.session_id()).c_str(),
                RateText(r, r.job_packets, j.session_id()).c_str(),
                RateText(r, r.job_retransmits, j.session_id()).c_str(),
                Si(static_cast<double>(j.packets_dropped())).c_str(), j.window());
  }
  uint64_t answered = 0;
  std::ostringstream refusals;
  for (const auto& c : s.calls()) {
    answered += c.count();
    if (c.code() == "OK") continue;
    refusals << (refusals.tellp() > 0 ? ", " : "") << c.method() << " " << c.code() << " "
             << c.count();
  }
  std::printf(
      "control: %u waiting barrier/broadcast call%s, %u worker stream%s, %llu calls "
      "answered; not OK: %s\n",
      s.waiting_calls(), s.waiting_calls() == 1 ? "" : "s", s.attached_streams(),
      s.attached_streams() == 1 ? "" : "s", static_cast<unsigned long long>(answered),
      refusals.tellp() > 0 ? refusals.str().c_str() : "none");
}

nlohmann::json ToJson(const std::string& address, const switchml_proto::StatusResponse& s,
                      const Rates& r) {
  nlohmann::json j;
  j["switch"] = address;
  j["version"] = s.version();
  j["uptime_s"] = s.uptime_ms() / 1e3;
  j["transport"] = s.transport();
  j["data_port"] = s.data_port();
  j["max_jobs"] = s.max_jobs();
  j["slots_per_job"] = s.slots_per_job();
  j["max_packet_numel"] = MaxPacketNumel(s);
  j["upstream"] = s.upstream();
  j["rate_interval_s"] = r.seconds;
  const auto rate = [&](const auto& m, auto key) -> nlohmann::json {
    auto it = m.find(key);
    if (r.seconds <= 0 || it == m.end()) return nullptr;
    return it->second;
  };
  j["threads"] = nlohmann::json::array();
  for (const auto& t : s.threads()) {
    j["threads"].push_back({{"port", t.port()},
                            {"packets_received", t.packets_received()},
                            {"packets_sent", t.packets_sent()},
                            {"cpu_s", t.cpu_ns() / 1e9},
                            {"packets_dropped", t.packets_dropped()},
                            {"received_per_s", rate(r.thread_rx, t.port())},
                            {"sent_per_s", rate(r.thread_tx, t.port())},
                            {"load", rate(r.thread_load, t.port())}});
  }
  j["jobs"] = nlohmann::json::array();
  for (const auto& x : s.jobs()) {
    j["jobs"].push_back({{"job_id", x.session_id()},
                         {"num_workers", x.num_workers()},
                         {"workers_registered", x.workers_registered()},
                         {"workers_attached", x.workers_attached()},
                         {"workers_closed", x.workers_closed()},
                         {"age_s", x.age_ms() / 1e3},
                         {"allreduces", x.allreduces()},
                         {"packets_received", x.packets_received()},
                         {"contributions", x.contributions()},
                         {"slot_rounds_completed", x.slot_rounds_completed()},
                         {"elements_aggregated", x.elements_aggregated()},
                         {"retransmissions_answered", x.retransmissions_answered()},
                         {"packets_dropped", x.packets_dropped()},
                         {"elements_per_packet", x.elements_per_packet()},
                         {"window", x.window()},
                         {"has_secret", x.has_secret()},
                         {"authenticated_data", x.authenticated_data()},
                         {"elements_per_s", rate(r.job_elements, x.session_id())},
                         {"packets_per_s", rate(r.job_packets, x.session_id())},
                         {"retransmissions_per_s", rate(r.job_retransmits, x.session_id())},
                         {"allreduces_per_s", rate(r.job_allreduces, x.session_id())}});
  }
  j["other_jobs"] = s.other_jobs();
  j["waiting_calls"] = s.waiting_calls();
  j["attached_streams"] = s.attached_streams();
  j["calls"] = nlohmann::json::array();
  for (const auto& c : s.calls()) {
    j["calls"].push_back({{"method", c.method()}, {"code", c.code()}, {"count", c.count()}});
  }
  return j;
}

void DefineStatusFlags(Flags* flags, StatusFlags* f) {
  flags->Add("switch", &f->switches,
             "the switch's control plane, HOST[:PORT] (or as the argument)");
  flags->Add("json", &f->json, "print JSON (one object per answer, one per line with --watch)");
  flags->Add("watch", &f->watch, "refresh every --interval until interrupted (or --count answers)");
  flags->Add("interval", &f->interval,
             "seconds between two answers, whose difference gives the rates (0: one answer, "
             "no rates)");
  flags->Add("count", &f->count, "with --watch: stop after this many answers (0 = never)");
  flags->Add("job-secret", &f->job_secret,
             "show the jobs created with this secret in full (default: "
             "$SWITCHML_JOB_SECRET); a switch run with --require-secret answers only "
             "requests that carry one");
  AddTlsClientFlags(flags, &f->tls);
  flags->Add("timeout-ms", &f->timeout_ms, "how long to wait for the switch's answer");
  flags->Add("log-level", &f->log_level, "debug, info, warning, error or off");
}

int Fail(const std::string& why, int code) {
  std::cerr << "switchml status: " << why << "\n";
  return code;
}

}  // namespace

int StatusCommand(const std::vector<std::string>& given) {
  std::vector<std::string> args = given;
  std::string positional;
  if (!args.empty() && !args[0].empty() && args[0][0] != '-') {
    positional = args[0];
    args.erase(args.begin());
  }
  Flags parser(
      "status",
      "Shows what the switch whose control plane is at HOST:PORT (default "
      "127.0.0.1:50099) is doing now: its data-plane threads and their load, the jobs\n"
      "you may see (those without a secret and those of --job-secret) with their "
      "workers, progress and rates, the other jobs as a count, and the control\n"
      "plane's refusals. Rates are the change between two answers --interval apart.\n"
      "Give the switch as the first argument (switchml status HOST[:PORT]) or as --switch.");
  StatusFlags flags;
  DefineStatusFlags(&parser, &flags);
  if (int code = ParseCommandLine("status", args, &parser, flags.log_level); code >= 0) return code;
  std::string where = flags.switches;
  if (!positional.empty() && !where.empty()) {
    return Fail("give the switch once: as the argument or as --switch", 2);
  }
  if (where.empty()) where = positional.empty() ? "127.0.0.1" : positional;
  auto host = transport::ParseHostPort(where, proto::kDefaultControlPort);
  if (!host.ok()) return Fail(host.status().message(), 2);
  Target t;
  t.address = where.find(':') == std::string::npos
                  ? where + ":" + std::to_string(proto::kDefaultControlPort)
                  : where;
  const double interval = flags.interval;
  const int64_t count = flags.count, timeout = flags.timeout_ms;
  if (!(interval >= 0 && interval <= 3600)) return Fail("--interval must be in 0..3600 s", 2);
  if (flags.watch && interval <= 0) return Fail("--watch needs --interval > 0", 2);
  if (count < 0) return Fail("--count must be >= 0 (0 = never stop)", 2);
  if (timeout < 1 || timeout > 3600000) return Fail("--timeout-ms must be in 1..3600000", 2);
  t.timeout = std::chrono::milliseconds(timeout);
  t.secret = flags.job_secret;
  if (t.secret.empty()) {
    if (const char* env = std::getenv("SWITCHML_JOB_SECRET")) t.secret = env;
  }
  t.server_name = flags.tls.server_name;
  auto credentials = Credentials(flags.tls);
  if (!credentials.ok()) return Fail(credentials.status().message(), 2);
  t.credentials = *credentials;

  StatusClient client(t);
  const bool json = flags.json, watch = flags.watch;
  const auto pause = std::chrono::duration<double>(interval);
  std::optional<switchml_proto::StatusResponse> before;
  if (interval > 0 && !watch) {  // one answer with rates: a first one to difference against
    auto first = client.Fetch();
    if (!first.ok()) return Fail(first.status().message(), 1);
    before = std::move(first).value();
    std::this_thread::sleep_for(pause);
  }
  for (int64_t shown = 0;;) {
    auto now = client.Fetch();
    if (!now.ok()) return Fail(now.status().message(), 1);
    const Rates rates = RatesBetween(before ? &*before : nullptr, *now);
    if (json) {
      std::printf("%s\n", ToJson(t.address, *now, rates).dump(watch ? -1 : 2).c_str());
    } else {
      if (watch && isatty(STDOUT_FILENO)) std::printf("\033[H\033[2J");  // clear the terminal
      PrintText(t.address, *now, rates);
      if (watch) std::printf("\n");
    }
    std::fflush(stdout);
    if (!watch || (count > 0 && ++shown >= count)) break;
    before = std::move(now).value();
    std::this_thread::sleep_for(pause);
  }
  return 0;
}

}  // namespace switchml::tools
