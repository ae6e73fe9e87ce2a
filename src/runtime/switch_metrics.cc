#include "runtime/switch_metrics.h"

#include <prometheus/collectable.h>

#include <chrono>
#include <string>

#include "control/registry.h"
#include "metrics/families.h"
#include "runtime/switch_daemon.h"

namespace switchml::runtime {
namespace {

using metrics::Counter;
using metrics::Gauge;
using metrics::Labels;

class SwitchCollector final : public prometheus::Collectable {
 public:
  explicit SwitchCollector(const SwitchDaemon* daemon) : daemon_(daemon) {}

  std::vector<prometheus::MetricFamily> Collect() const override {
    const control::SwitchSnapshot snap = daemon_->Snapshot();
    const control::ControlServer& control = daemon_->control_server();
    std::vector<prometheus::MetricFamily> out;
    CollectSwitch(snap, control, &out);
    CollectJobs(snap, control.registry().JobSummaries(), &out);
    return out;
  }

 private:
  static void CollectSwitch(const control::SwitchSnapshot& snap,
                            const control::ControlServer& control,
                            std::vector<prometheus::MetricFamily>* out) {
    Gauge("switchml_switch_info", "The switch's version and data-plane transport (always 1).")
        .Add(1, {{"version", SWITCHML_VERSION_STRING}, {"transport", snap.transport}})
        .MoveTo(out);
    Gauge("switchml_switch_uptime_seconds", "Seconds since the switch started.")
        .Add(std::chrono::duration<double>(snap.uptime).count())
        .MoveTo(out);
    Gauge("switchml_switch_data_threads", "Data-plane threads (one data port each).")
        .Add(static_cast<double>(snap.threads.size()))
        .MoveTo(out);
    Gauge("switchml_switch_max_jobs", "Concurrent jobs the switch holds (--max-jobs).")
        .Add(snap.config.max_jobs)
        .MoveTo(out);
    Gauge("switchml_switch_slots_per_job", "Aggregation slots in each job's pool (--slots).")
        .Add(snap.config.slots_per_job)
        .MoveTo(out);

    auto rx = Counter("switchml_switch_thread_packets_received_total",
                      "Datagrams a data-plane thread received.");
    auto tx = Counter("switchml_switch_thread_packets_sent_total",
                      "Datagrams a data-plane thread sent (results, re-sends, partial sums).");
    auto cpu = Counter("switchml_switch_thread_cpu_seconds_total",
                       "CPU time a data-plane thread used (its load: the rate of this).");
    auto rx_calls = Counter("switchml_switch_thread_receive_calls_total",
                            "Receive calls of a data-plane thread's transport.");
    auto tx_calls = Counter("switchml_switch_thread_send_calls_total",
                            "Send calls of a data-plane thread's transport.");
    std::array<uint64_t, dataplane::kNumDropReasons> dropped{};
    uint64_t oversized = 0, auth = 0, send_errors = 0, loss_in = 0, loss_out = 0, resends = 0;
    for (size_t k = 0; k < snap.threads.size(); ++k) {
      const control::ThreadSnapshot& t = snap.threads[k];
      const Labels l = {{"thread", std::to_string(k)}};
      rx.Add(static_cast<double>(t.received), l);
      tx.Add(static_cast<double>(t.sent), l);
      cpu.Add(t.cpu_seconds, l);
      rx_calls.Add(static_cast<double>(t.receive_calls), l);
      tx_calls.Add(static_cast<double>(t.send_calls), l);
      for (int r = 0; r < dataplane::kNumDropReasons; ++r) dropped[r] += t.dropped[r];
      oversized += t.truncated;
      auth += t.auth_dropped;
      send_errors += t.send_errors;
      loss_in += t.loss_dropped_in;
      loss_out += t.loss_dropped_out;
      resends += t.unicast_resends;
    }
    for (auto* f : {&rx, &tx, &cpu, &rx_calls, &tx_calls}) f->MoveTo(out);

    auto drops = Counter("switchml_switch_packets_dropped_total",
                         "Datagrams the switch dropped, by cause (auth_failed: the authenticated "
                         "data plane's tag did not verify; oversized: longer than any SwitchML "
                         "packet; send_error: replies the transport could not send).");
    for (int r = 1; r < dataplane::kNumDropReasons; ++r) {
      drops.Add(static_cast<double>(dropped[r]),
                {{"reason", dataplane::DropReasonName(static_cast<dataplane::DropReason>(r))}});
    }
    drops.Add(static_cast<double>(oversized), {{"reason", "oversized"}});
    drops.Add(static_cast<double>(auth), {{"reason", "auth_failed"}});
    drops.Add(static_cast<double>(send_errors), {{"reason", "send_error"}});
    drops.MoveTo(out);
    Counter("switchml_switch_loss_simulator_dropped_total",
            "Datagrams the loss simulator (--loss) dropped, by direction.")
        .Add(static_cast<double>(loss_in), {{"direction", "in"}})
        .Add(static_cast<double>(loss_out), {{"direction", "out"}})
        .MoveTo(out);
    Counter("switchml_switch_retransmissions_answered_total",
            "Worker retransmissions into a completed slot, answered with the stored result.")
        .Add(static_cast<double>(resends))
        .MoveTo(out);
    Counter("switchml_switch_jobs_evicted_total",
            "Jobs removed to make room for new ones (the least recently active).")
        .Add(static_cast<double>(snap.jobs_evicted))
        .MoveTo(out);

    auto calls = Counter("switchml_control_calls_total",
                         "Control-plane calls answered, by method and gRPC status code "
                         "(refusals: every code but OK).");
    for (const control::CallStats::Entry& e : control.call_stats().Read()) {
      calls.Add(static_cast<double>(e.count), {{"method", e.method}, {"code", e.code}});
    }
    calls.MoveTo(out);
    const control::RegistryCounts counts = control.registry().counts();
    Gauge("switchml_control_waiting_calls",
          "Barrier and broadcast calls waiting for the rest of their round.")
        .Add(counts.waiting_calls)
        .MoveTo(out);
    Gauge("switchml_control_attached_streams", "Workers' control streams attached.")
        .Add(counts.attached_streams)
        .MoveTo(out);
  }

  static void CollectJobs(const control::SwitchSnapshot& snap,
                          const std::vector<control::Registry::JobSummary>& jobs,
                          std::vector<prometheus::MetricFamily>* out) {
    Gauge("switchml_switch_jobs", "Jobs on the switch now.")
        .Add(static_cast<double>(jobs.size()))
        .MoveTo(out);
    auto workers = Gauge("switchml_job_workers", "Workers the job was created for.");
    auto registered = Gauge("switchml_job_workers_registered", "Workers registered so far.");
    auto attached = Gauge("switchml_job_workers_attached",
                          "Workers whose control stream is attached (this project's workers).");
    auto age = Gauge("switchml_job_age_seconds", "Seconds since the job was created.");
    auto allreduces = Counter("switchml_job_allreduces_total",
                              "All-reduces every worker of the job has begun (announced alike "
                              "on their control streams; 0 for reference clients).");
    auto slots = Gauge("switchml_job_slots_in_use", "Slots the job's window uses, [0, window).");
    auto received =
        Counter("switchml_job_packets_received_total", "Data-plane packets attributed to the job.");
    auto contributions = Counter("switchml_job_contributions_total",
                                 "Workers' packets aggregated into a slot (first copies).");
    auto rounds = Counter("switchml_job_slot_rounds_completed_total",
                          "Slot rounds completed (each result sent once to the job).");
    auto elements = Counter("switchml_job_elements_aggregated_total",
                            "Elements of the results completed (rounds x elements per packet).");
    auto bytes = Counter("switchml_job_bytes_received_total",
                         "Payload bytes of the job's packets received.");
    auto resends = Counter("switchml_job_retransmissions_answered_total",
                           "Retransmissions into a completed slot answered with the result.");
    auto drops =
        Counter("switchml_job_packets_dropped_total", "The job's packets dropped, by cause.");
    for (const control::Registry::JobSummary& j : jobs) {
      const Labels l = {{"session", std::to_string(j.job_id)}};
      workers.Add(j.num_workers, l);
      registered.Add(j.registered, l);
      attached.Add(j.attached, l);
      age.Add(std::chrono::duration<double>(j.age).count(), l);
      allreduces.Add(static_cast<double>(j.allreduces), l);
      auto it = snap.jobs.find(j.job_id);
      if (it == snap.jobs.end()) continue;
      const control::JobDataSnapshot& d = it->second;
      const dataplane::JobCounters& c = d.counters;
      slots.Add(d.spec.max_outstanding_packets, l);
      received.Add(static_cast<double>(c.received), l);
      contributions.Add(static_cast<double>(c.aggregated), l);
      rounds.Add(static_cast<double>(c.completed), l);
      elements.Add(static_cast<double>(c.completed) * d.elements_per_packet, l);
      bytes.Add(static_cast<double>(c.received) * d.payload_bytes, l);
      resends.Add(static_cast<double>(c.retransmitted), l);
      for (int r = 1; r < dataplane::kNumDropReasons; ++r) {
        Labels lr = l;
        lr.push_back({"reason", dataplane::DropReasonName(static_cast<dataplane::DropReason>(r))});
        drops.Add(static_cast<double>(c.dropped[r]), lr);
      }
    }
    for (auto* f : {&workers, &registered, &attached, &age, &allreduces, &slots, &received,
                    &contributions, &rounds, &elements, &bytes, &resends, &drops}) {
      f->MoveTo(out);
    }
  }

  const SwitchDaemon* daemon_;
};

}  // namespace

std::shared_ptr<prometheus::Collectable> SwitchMetricsCollector(const SwitchDaemon* daemon) {
  return std::make_shared<SwitchCollector>(daemon);
}

}  // namespace switchml::runtime
