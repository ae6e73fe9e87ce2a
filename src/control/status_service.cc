#include "control/status_service.h"

#include <chrono>

namespace switchml::control {

namespace {
uint64_t Millis(std::chrono::steady_clock::duration d) {
  return static_cast<uint64_t>(
      std::max<int64_t>(0, std::chrono::duration_cast<std::chrono::milliseconds>(d).count()));
}
}  // namespace

grpc::Status AnswerStatus(const Registry& registry, const CallStats& calls,
                          const SwitchSnapshot* snapshot,
                          const switchml_proto::StatusRequest& request,
                          switchml_proto::StatusResponse* response) {
  if (registry.options().require_secret && request.job_secret().empty()) {
    return grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                        "this switch requires a job secret (--require-secret): pass the secret "
                        "of a job of yours (switchml status --secret-file FILE)");
  }
  uint32_t hidden = 0;
  const std::vector<Registry::JobSummary> jobs =
      registry.JobSummaries(&request.job_secret(), &hidden);
  response->set_version(SWITCHML_VERSION_STRING);
  response->set_other_jobs(hidden);
  const RegistryCounts counts = registry.counts();
  response->set_waiting_calls(counts.waiting_calls);
  response->set_attached_streams(counts.attached_streams);
  if (snapshot != nullptr) {
    response->set_uptime_ms(Millis(snapshot->uptime));
    response->set_transport(snapshot->transport);
    response->set_data_port(snapshot->data_port);
    response->set_max_jobs(snapshot->config.max_jobs);
    response->set_slots_per_job(snapshot->config.slots_per_job);
    response->set_max_packet_numel(snapshot->config.max_packet_numel);
    response->set_upstream(snapshot->upstream);
    for (const ThreadSnapshot& t : snapshot->threads) {
      switchml_proto::StatusThread* out = response->add_threads();
      out->set_port(t.port);
      out->set_packets_received(t.received);
      out->set_packets_sent(t.sent);
      out->set_cpu_ns(static_cast<uint64_t>(t.cpu_seconds * 1e9));
      out->set_packets_dropped(t.DroppedTotal());
    }
  }
  for (const Registry::JobSummary& j : jobs) {
    switchml_proto::StatusJob* out = response->add_jobs();
    out->set_session_id(j.job_id);
    out->set_num_workers(j.num_workers);
    out->set_workers_registered(j.registered);
    out->set_workers_attached(j.attached);
    out->set_workers_closed(j.closed);
    out->set_age_ms(Millis(j.age));
    out->set_allreduces(j.allreduces);
    out->set_has_secret(j.has_secret);
    out->set_authenticated_data(j.authenticated_data);
    if (snapshot == nullptr) continue;
    auto it = snapshot->jobs.find(j.job_id);
    if (it == snapshot->jobs.end()) continue;
    const JobDataSnapshot& d = it->second;
    out->set_packets_received(d.counters.received);
    out->set_contributions(d.counters.aggregated);
    out->set_slot_rounds_completed(d.counters.completed);
    out->set_elements_aggregated(d.counters.completed * d.elements_per_packet);
    out->set_retransmissions_answered(d.counters.retransmitted);
    uint64_t dropped = 0;
    for (int r = 1; r < dataplane::kNumDropReasons; ++r) dropped += d.counters.dropped[r];
    out->set_packets_dropped(dropped);
    out->set_elements_per_packet(d.elements_per_packet);
    out->set_window(d.spec.max_outstanding_packets);
  }
  for (const CallStats::Entry& e : calls.Read()) {
    switchml_proto::StatusCalls* out = response->add_calls();
    out->set_method(e.method);
    out->set_code(e.code);
    out->set_count(e.count);
  }
  return grpc::Status::OK;
}

}  // namespace switchml::control
