// Fuzzes the control plane's rules (control::Registry, no gRPC; control_fuzz drives the gRPC
// server) with arbitrary sequences of registrations, barriers, broadcasts, cancellations, closes
// (also with a failure report), streams opened before their first message and attached ones and
// their reports (checks, failures), calls run on threads of their own (a top-of-rack switch's
// forwarded calls), lease ticks and a moving clock, from a few clients, with and without
// secrets; optionally with a top-of-rack switch's hooks (checks held until confirmed).
//
// Checks: no crash or sanitizer report; every Barrier/Broadcast completion runs exactly once
// (before or at Shutdown); a stream's end runs at most once, never after Detach; the registry's
// jobs are the switch's jobs; strangers' calls never exceed the total limit nor a job's members'
// its allowance, and nothing stays counted once every call and stream ended; a job created with
// a secret is never changed by a request carrying another secret (refused, same job spec and
// workers, same existence); a job's end is reported once it is gone; with the hooks, a check
// reaches a stream only after it was handed to the hook and confirmed.
#include <fuzzer/FuzzedDataProvider.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "control/registry.h"
#include "dataplane/switch.h"
#include "fuzz_check.h"

namespace switchml::control {
namespace {

constexpr uint64_t kSessions[] = {0, 1, 2, 3, UINT64_MAX};
const char* const kSecrets[] = {"", "alpha", "bravo"};

struct Calls {
  std::map<uint64_t, int> sync_done;   // ticket -> completions
  std::map<uint64_t, int> stream_end;  // ticket -> ends
  std::map<uint64_t, bool> detached;   // ticket -> Detach returned
};

Caller MakeCaller(FuzzedDataProvider& in) {
  Caller c;
  const int who = in.ConsumeIntegralInRange<int>(0, 3);
  if (who == 3) {
    c.peer = "unix:/tmp/x";
    return c;
  }
  c.ipv4 = 0x0a000001 + static_cast<uint32_t>(who);
  c.has_ipv4 = true;
  c.peer = "ipv4:10.0.0." + std::to_string(1 + who) + ":" +
           std::to_string(in.ConsumeIntegralInRange<int>(1000, 1003));
  return c;
}

// The job's state as the switch holds it, to compare before and after a refused request.
std::string Snapshot(dataplane::LockedSwitch& sw, uint64_t id) {
  std::lock_guard<std::mutex> lock(sw.mu);
  const dataplane::JobSpec* s = sw.sw.FindJob(id);
  if (s == nullptr) return "none";
  return std::to_string(s->num_workers) + "/" + std::to_string(static_cast<int>(s->size)) + "/" +
         std::to_string(s->num_ports) + "/" + std::to_string(s->max_outstanding_packets);
}

}  // namespace
}  // namespace switchml::control

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace switchml;
  using namespace switchml::control;
  FuzzedDataProvider in(data, size);
  dataplane::SwitchConfig sc;
  sc.max_workers_per_job = 8;
  sc.slots_per_job = 64;
  sc.max_jobs = in.ConsumeIntegralInRange<uint32_t>(1, 4);
  dataplane::LockedSwitch sw(sc);
  RegistryOptions opts;
  opts.require_secret = in.ConsumeBool();
  opts.allow_foreign_address = in.ConsumeBool();
  opts.lease = std::chrono::milliseconds(in.ConsumeIntegralInRange<int>(1, 5000));
  opts.attach_grace = std::chrono::milliseconds(in.ConsumeIntegralInRange<int>(1, 5000));
  opts.failure_memory = std::chrono::milliseconds(in.ConsumeIntegralInRange<int>(1, 5000));
  opts.max_calls_per_client = in.ConsumeIntegralInRange<uint32_t>(1, 8);
  opts.max_calls_total = in.ConsumeIntegralInRange<uint32_t>(1, 16);
  opts.max_open_checks = in.ConsumeIntegralInRange<uint32_t>(1, 8);
  opts.max_forwarded_stranger_calls = in.ConsumeIntegralInRange<uint32_t>(1, 8);
  opts.max_forwarded_stranger_calls_per_client = in.ConsumeIntegralInRange<uint32_t>(1, 8);
  opts.idle_reclaim = std::chrono::milliseconds(in.ConsumeIntegralInRange<int>(1, 20000));
  opts.first_message_timeout = std::chrono::milliseconds(in.ConsumeIntegralInRange<int>(1, 5000));
  if (!opts.Validate().ok()) return 0;
  auto now = std::chrono::steady_clock::time_point{} + std::chrono::hours(1);
  // Which secret created each session, as far as the harness saw it succeed.
  std::map<uint64_t, std::string> owner;
  Calls calls;
  std::vector<uint64_t> syncs, streams, opened, forwarded;
  // Top-of-rack hooks: checks the rack agreed on, waiting for ConfirmCheck.
  const bool tor = in.ConsumeBool();
  std::vector<std::pair<uint64_t, uint64_t>> agreed;       // (session, op) handed to the hook
  std::map<std::pair<uint64_t, uint64_t>, int> confirmed;  // ConfirmCheck calls
  Registry* registry = nullptr;
  RegistryHooks hooks;
  hooks.job_ended = [&registry](uint64_t id, const Status&) {
    FUZZ_CHECK(registry != nullptr && !registry->HasJob(id));  // reported once it is gone
  };
  if (tor) {
    hooks.check_agreed = [&agreed](uint64_t id, uint64_t op, uint64_t, uint32_t) {
      agreed.emplace_back(id, op);
    };
  }
  {
    Registry reg(
        opts, &sw, [&now] { return now; }, hooks);
    registry = &reg;
    while (in.remaining_bytes() > 0) {
      const uint8_t op = in.ConsumeIntegral<uint8_t>();
      const uint64_t session = kSessions[in.ConsumeIntegralInRange<int>(0, 4)];
      const std::string secret = kSecrets[in.ConsumeIntegralInRange<int>(0, 2)];
      const Caller caller = MakeCaller(in);
      const bool exists = reg.HasJob(session);
      const std::string before = Snapshot(sw, session);
      const bool foreign =
          exists && owner.count(session) && !owner[session].empty() && owner[session] != secret;
      // A request with another job's secret changes nothing of that job.
      auto check_refused_if_foreign = [&](const Status& st) {
        if (!foreign) return;
        FUZZ_CHECK(!st.ok());
        FUZZ_CHECK(reg.HasJob(session));
        FUZZ_CHECK(Snapshot(sw, session) == before);
      };
      switch (op % 13) {
        case 0:
        case 1: {
          RegisterRequest r;
          r.job_id = session;
          r.rank = in.ConsumeIntegralInRange<uint32_t>(0, 9);
          r.num_workers = in.ConsumeIntegralInRange<uint32_t>(0, 9);
          r.ipv4 = in.ConsumeBool() ? 0 : caller.ipv4 + in.ConsumeIntegralInRange<uint32_t>(0, 1);
          r.packet_size = in.ConsumeIntegralInRange<int>(-1, 4);
          r.udp_port = in.ConsumeIntegralInRange<uint32_t>(0, 70000);
          r.num_udp_ports = in.ConsumeIntegralInRange<uint32_t>(0, 5);
          r.max_outstanding_packets = in.ConsumeIntegralInRange<uint32_t>(0, 100);
          r.running_tsi = in.ConsumeBool();
          r.authenticate_data = in.ConsumeBool();
          r.secret = secret;
          std::string data_key;
          const Status st = reg.Register(r, caller, &data_key);
          // A job that asked for the authenticated data plane hands out its 16-byte key.
          if (st.ok()) FUZZ_CHECK(data_key.size() == (r.authenticate_data ? 16u : 0u));
          check_refused_if_foreign(st);
          if (st.ok() && r.rank == 0) owner[session] = secret;
          break;
        }
        case 2:
        case 3: {
          SyncRequest r;
          r.broadcast = in.ConsumeBool();
          r.job_id = session;
          r.num_workers = in.ConsumeIntegralInRange<uint32_t>(0, 5);
          r.has_rank = in.ConsumeBool();
          r.rank = in.ConsumeIntegralInRange<uint32_t>(0, 5);
          r.root = in.ConsumeIntegralInRange<uint32_t>(0, 5);
          r.value = in.ConsumeIntegral<uint64_t>();
          r.secret = secret;
          const uint64_t t = reg.NewTicket();
          calls.sync_done[t] = 0;
          syncs.push_back(t);
          reg.Sync(t, r, caller, [&calls, t](const Status&, ErrorReason, uint64_t) {
            FUZZ_CHECK(++calls.sync_done[t] == 1);
          });
          if (foreign) FUZZ_CHECK(Snapshot(sw, session) == before);
          break;
        }
        case 4:
          if (!syncs.empty()) {
            reg.CancelWait(syncs[in.ConsumeIntegralInRange<size_t>(0, syncs.size() - 1)],
                           CancelledError("fuzz"));
          }
          break;
        case 5: {
          CloseRequest r;
          r.job_id = session;
          r.secret = secret;
          r.has_rank = in.ConsumeBool();
          r.rank = in.ConsumeIntegralInRange<uint32_t>(0, 5);
          if (in.ConsumeBool()) r.failure = "failed on the caller's side";
          const Status st = reg.Close(r, caller);
          if (r.failure.empty()) {
            check_refused_if_foreign(st);
          } else if (foreign) {  // taken as for no job: only that secret's calls fail
            FUZZ_CHECK(reg.HasJob(session));
            FUZZ_CHECK(Snapshot(sw, session) == before);
          }
          break;
        }
        case 6: {
          AttachRequest r;
          r.job_id = session;
          r.rank = in.ConsumeIntegralInRange<uint32_t>(0, 5);
          r.secret = secret;
          if (in.ConsumeBool()) r.label = "rack " + std::to_string(r.rank);
          // The first message of a stream opened before (OpenStream), or a stream of its own.
          uint64_t t = 0;
          if (!opened.empty() && in.ConsumeBool()) {
            const size_t k = in.ConsumeIntegralInRange<size_t>(0, opened.size() - 1);
            t = opened[k];
            opened.erase(opened.begin() + static_cast<std::ptrdiff_t>(k));
            r.opened = true;
          } else {
            t = reg.NewTicket();
            calls.stream_end[t] = 0;
            calls.detached[t] = false;
          }
          const Status st = reg.Attach(
              t, r, caller,
              [&calls, t](const Status&) {
                FUZZ_CHECK(!calls.detached[t]);
                FUZZ_CHECK(++calls.stream_end[t] == 1);
              },
              [&confirmed, tor, session](uint64_t op) {
                // With the hooks, only what the hook was asked to confirm, and was.
                if (tor) FUZZ_CHECK((confirmed[{session, op}] > 0));
              });
          if (st.ok()) streams.push_back(t);
          if (foreign) {
            FUZZ_CHECK(!st.ok());
            FUZZ_CHECK(Snapshot(sw, session) == before);
          }
          break;
        }
        case 7:
          if (!streams.empty()) {
            const uint64_t t = streams[in.ConsumeIntegralInRange<size_t>(0, streams.size() - 1)];
            if (in.ConsumeBool()) {
              reg.Report(t, in.ConsumeIntegralInRange<uint64_t>(0, 4),
                         in.ConsumeIntegralInRange<uint64_t>(0, 3),
                         in.ConsumeIntegralInRange<uint32_t>(0, 3));
            } else if (!calls.detached[t]) {
              reg.Detach(t);
              calls.detached[t] = true;
            }
          }
          break;
        case 8:
          now += std::chrono::milliseconds(in.ConsumeIntegralInRange<int>(0, 3000));
          reg.Tick();
          break;
        case 10: {  // a stream opens and sends nothing (yet)
          const uint64_t t = reg.NewTicket();
          calls.stream_end[t] = 0;
          calls.detached[t] = false;
          if (reg.OpenStream(t, caller,
                             [&calls, t](const Status&) {
                               FUZZ_CHECK(!calls.detached[t]);
                               FUZZ_CHECK(++calls.stream_end[t] == 1);
                             })
                  .ok()) {
            opened.push_back(t);
          }
          break;
        }
        case 11:  // its connection ends
          if (!opened.empty()) {
            const size_t k = in.ConsumeIntegralInRange<size_t>(0, opened.size() - 1);
            reg.Detach(opened[k]);
            calls.detached[opened[k]] = true;
            opened.erase(opened.begin() + static_cast<std::ptrdiff_t>(k));
          }
          break;
        case 12:  // a call run on a thread of its own starts, or one ends
          if (!forwarded.empty() && in.ConsumeBool()) {
            const size_t k = in.ConsumeIntegralInRange<size_t>(0, forwarded.size() - 1);
            reg.ReleaseForwarded(forwarded[k]);
            forwarded.erase(forwarded.begin() + static_cast<std::ptrdiff_t>(k));
          } else {
            const uint64_t t = reg.NewTicket();
            if (reg.AdmitForwarded(t, caller, session, secret, in.ConsumeBool()).ok()) {
              forwarded.push_back(t);
            }
          }
          break;
        case 9:
          if (in.ConsumeBool()) {
            if (!streams.empty()) {  // a member reports a failure on its side
              const uint64_t t = streams[in.ConsumeIntegralInRange<size_t>(0, streams.size() - 1)];
              if (!calls.detached[t]) reg.ReportFailure(t, in.ConsumeRandomLengthString(2000));
            }
          } else if (!agreed.empty()) {  // the upstream confirms a check the rack agreed on
            const auto [id, op] = agreed[in.ConsumeIntegralInRange<size_t>(0, agreed.size() - 1)];
            ++confirmed[{id, op}];
            reg.ConfirmCheck(id, op);
          }
          break;
      }
      FUZZ_CHECK(reg.counts().stranger_calls <= opts.max_calls_total);
      FUZZ_CHECK(reg.counts().forwarded_calls == forwarded.size());
      for (uint64_t id : kSessions) {
        FUZZ_CHECK(reg.counts(id).member_calls <=
                   kMemberCallsPerWorker * (sc.max_workers_per_job + 1));
        const bool in_registry = reg.HasJob(id);
        std::lock_guard<std::mutex> lock(sw.mu);
        FUZZ_CHECK(in_registry == sw.sw.HasJob(id));
      }
    }
    // Every call and stream ends: nothing may stay counted.
    if (size > 0 && (data[0] & 1) != 0) {
      for (uint64_t t : forwarded) reg.ReleaseForwarded(t);
      forwarded.clear();
      for (uint64_t t : syncs) reg.CancelWait(t, CancelledError("fuzz: the end"));
      for (const std::vector<uint64_t>* v : {&streams, &opened}) {
        for (uint64_t t : *v) {
          if (!calls.detached[t]) reg.Detach(t);
          calls.detached[t] = true;
        }
      }
      FUZZ_CHECK(reg.counts().waiting_calls == 0);
      FUZZ_CHECK(reg.counts().attached_streams == 0);
      FUZZ_CHECK(reg.counts().pending_streams == 0);
      FUZZ_CHECK(reg.counts().stranger_calls == 0);
      for (uint64_t id : kSessions) FUZZ_CHECK(reg.counts(id).member_calls == 0);
    }
    for (uint64_t t : forwarded) reg.ReleaseForwarded(t);
    reg.Shutdown();
    FUZZ_CHECK(reg.counts().waiting_calls == 0);
    FUZZ_CHECK(reg.counts().pending_streams == 0);
    FUZZ_CHECK(reg.counts().stranger_calls == 0);
    registry = nullptr;
  }
  for (const auto& [t, n] : calls.sync_done) FUZZ_CHECK(n == 1);
  for (const auto& [t, n] : calls.stream_end) FUZZ_CHECK(n <= 1);
  return 0;
}
