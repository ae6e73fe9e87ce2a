// A discrete-event simulator of SwitchML jobs on a simulated network, running the real data plane
// (dataplane::Switch) and the real worker protocol (worker::WorkerSession, inside the worker
// library's worker::StripedSession, which also stripes a job over several switches) for every
// packet: the
// simulator only moves their datagrams over links in virtual time. Pure: no sockets, threads or
// wall clocks; the same configuration and seed give the same result bit for bit.
//
// The model (docs/simulator.md says why):
//   - Each directed link is a FIFO transmitter: a packet of d datagram bytes occupies it for
//     (d + kWireOverheadBytes) * 8 / rate and arrives propagation_ns after its last bit left.
//     Faults (loss, duplication, reordering) and tail drop at a finite buffer are per link.
//   - A switch node runs one dataplane::Switch. A datagram addressed to it is processed on
//     arrival; its replies enter the output links after switch_latency_ns (and, with switch_pps,
//     after waiting for the pipeline: one packet per 1/switch_pps). A datagram addressed to
//     another node is forwarded on the shortest path after switch_latency_ns.
//   - A host node runs the WorkerSessions of its workers (one per worker thread, each with its own
//     UDP port and slot range, as runtime::WorkerThread). A session's datagrams enter the host's
//     link host_latency_ns after PollTransmit gives them, addressed to the job's switch or, when
//     the job is striped over several switches, to the one that serves the datagram's slot;
//     datagrams are handed to HandleDatagram on arrival (plus host_latency_ns of the receive path,
//     folded into the link's delay); its HandleTimeout runs at the time PollTimeout asks for. The
//     host CPU is otherwise free.
//   - Events: one heap of (time, sequence) entries holding each link's head-of-line arrival, each
//     session's next timer, and out-of-order (reordered) deliveries. Packet buffers come from a
//     pool: no allocation per packet in steady state.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "dataplane/switch.h"
#include "proto/wire.h"
#include "sim/topology.h"
#include "switchml/status.h"
#include "switchml/types.h"
#include "worker/session.h"

namespace switchml::sim {

// Bytes a datagram costs on a link beyond its own: IPv4 + UDP headers (28) and Ethernet header,
// FCS, preamble and inter-frame gap (38), as docs/architecture.md 4.5 counts them.
inline constexpr uint32_t kWireOverheadBytes = 66;

// The link-level goodput ceiling of the SwitchML packet format: tensor elements per second one
// link of `gbps` can carry in packets of `size`.
double GoodputCeilingElementsPerSecond(double gbps, proto::SizeCode size);

struct Collective {
  DataType dtype = DataType::kInt32;
  uint64_t count = 0;  // elements
};

struct JobConfig {
  uint64_t job_id = 1;
  uint32_t switch_node = 0;     // the switch the job's workers send to (unused with stripes)
  std::vector<uint32_t> hosts;  // rank r runs on hosts[r]
  // Two levels (docs/hierarchy.md): rank r sends to the top-of-rack switch tors[r], whose
  // job (the ranks with that ToR, in rank order) has switch_node, the spine, as its upstream; the
  // spine's job has one member per distinct ToR (racks in order of first appearance). Every
  // worker quantizes for the global worker count. Empty: one level, every rank on switch_node.
  // (A ToR-spine pair carries one two-level job at a time: dataplane::Switch::SetUpstream.)
  std::vector<uint32_t> tors;
  // Striping (issue 26, docs/simulator.md "Server aggregators"): the switch nodes that serve the
  // job, each its share of every worker thread's slots: local slot l of a thread's window W
  // (the slot index minus the thread's slot_start) goes to stripes[worker::StripeOfSlot(l, W,
  // stripes.size())], as the sessions' worker::StripedSession::NextTransmitHost names it. Each
  // runs the whole job (one JobSpec,
  // every worker registered) and sees only the packets of its slots; the results come from it.
  // At most W entries, distinct; not with tors. Empty: switch_node serves every slot.
  std::vector<uint32_t> stripes;
  proto::SizeCode size = proto::SizeCode::k1024B;
  uint32_t window = 256;                // outstanding packets per worker, all threads together
  uint32_t threads = 1;                 // sessions (ports, slot ranges) per worker
  std::vector<Collective> collectives;  // all-reduces run back to back
  double start_ns = 0;
  // Block-sparse all-reduces (docs/protocol.md 2.5): each of the job's all-reduces runs as the
  // announcement of the workers' non-zero blocks and the union's slice (worker::SparseSession).
  bool sparse = false;
  // The inputs' block density and overlap (testing::Pattern): the fraction of blocks non-zero on
  // some worker, and who holds them. With PayloadMode::kShared every worker has the same input,
  // so the union is the one input's non-zero blocks. 1: the dense pattern.
  double density = 1;
  double overlap = 1;
};

// How the workers' tensors are held.
enum class PayloadMode : uint8_t {
  // Each worker has its own input (testing::Pattern, distinct per rank) and output, and every
  // result of every worker is checked. Memory: 2 x workers x tensor.
  kVerified,
  // One input and one output buffer per job, shared by all its workers (identical inputs, so
  // identical results): memory 2 x tensor whatever the worker count. The last all-reduce's
  // output is checked to be n x input (int32 exactly, float32 within the quantization bound);
  // each all-reduce's input is written when its first worker (any rank) starts it.
  kShared,
};

struct Progress {
  double sim_seconds = 0;
  uint64_t events = 0;
  double fraction = 0;  // of all jobs' packets answered, 0..1
};

struct SimConfig {
  Topology topology;
  std::vector<JobConfig> jobs;
  // Per switch node. slots_per_job bounds each job's window; max_workers_per_job is raised to the
  // largest job's worker count (the switch refuses more than its bitmap width).
  dataplane::SwitchConfig switch_config;
  double switch_latency_ns = 500;  // per-packet pipeline latency
  double switch_pps = 0;           // pipeline capacity, packets per second (0: unlimited)
  double host_latency_ns = 0;      // added to every packet a host sends (NIC, stack)
  // Host timer granularity: a session's HandleTimeout runs at its PollTimeout deadline rounded up
  // to a multiple of this (0: exactly then). Coarser timers mean fewer events (a deadline per
  // packet sent otherwise) and retransmissions up to this much later.
  double timer_granularity_ns = 1000;
  // The sessions' timing: timeout policy, RTO bounds, progress timeout. num_workers, slot_start,
  // window and size are set per job and thread.
  worker::SessionConfig session;
  PayloadMode payload = PayloadMode::kShared;
  uint64_t seed = 1;
  double max_sim_seconds = 600;  // virtual time limit: jobs still running then fail
  // Called about every progress_every_events events (and never when null).
  std::function<void(const Progress&)> progress;
  uint64_t progress_every_events = uint64_t{1} << 23;
  Status Validate() const;
};

struct StallStats {
  // Slot rounds completed at the switch, each timed from its first contribution's arrival to the
  // arrival of the one that completed it (0 when all workers' packets arrive together).
  uint64_t rounds = 0;
  double mean_ns = 0, p50_ns = 0, p99_ns = 0, max_ns = 0;
  // Rounds longer than 2 x p50 + 1 us: a contribution was late (lost and re-sent, or delayed).
  uint64_t stalled = 0;
};

// One switch's view of a job (its JobCounters), for each switch the job's workers send to.
struct StripeResult {
  uint32_t node = 0;
  uint64_t received = 0;    // datagrams of the job
  uint64_t aggregated = 0;  // fresh contributions
  uint64_t completed = 0;   // slot rounds completed
  uint64_t unicasts = 0;    // stored results re-sent to one worker
  uint64_t duplicates_dropped = 0;
  std::vector<uint32_t> slots;  // the slots that received datagrams, ascending
};

struct JobResult {
  uint64_t job_id = 0;
  uint32_t workers = 0;
  Status status;
  bool verified = false;  // every result checked and correct
  std::string verify_error;
  std::vector<double> collective_seconds;  // each all-reduce: first start to last worker done
  double seconds = 0;                      // all of them, back to back
  uint64_t elements = 0;                   // sum of the collectives' counts
  double elements_per_second = 0;
  // Summed over the job's sessions.
  uint64_t sent = 0, retransmitted = 0, timeouts = 0, results = 0, duplicates = 0;
  uint64_t early_retransmits = 0;
  uint64_t foreign_slot = 0, stale = 0;  // results a session dropped: not its slot, other job
  // From the switches' job counters.
  uint64_t switch_unicasts = 0, switch_duplicates_dropped = 0;
  uint64_t switch_wrong_size = 0, switch_slot_out_of_range = 0;
  // The switches the workers send to: switch_node, or each of the stripes in order. (The
  // switch_* sums above are over them.)
  std::vector<StripeResult> stripes;
  StallStats stalls;
  // Sparse jobs (JobConfig::sparse), summed over the sessions: blocks announced, and of those the
  // union's (aggregated).
  uint64_t sparse_blocks = 0, sparse_union_blocks = 0;
};

struct LinkResult {
  uint32_t from = 0, to = 0;
  uint64_t packets = 0, bytes = 0;  // transmitted (wire bytes), lost ones included
  uint64_t lost = 0, tail_dropped = 0, duplicated = 0, reordered = 0;
  double utilisation = 0;  // busy time / simulated time
  uint64_t max_queue_bytes = 0;
};

struct SimResult {
  double sim_seconds = 0;
  uint64_t events = 0;
  uint64_t packets_delivered = 0;
  uint64_t switch_unknown_source = 0;  // datagrams a switch could not attribute to a job
  std::vector<JobResult> jobs;
  std::vector<LinkResult> links;
  bool ok() const;  // every job OK and verified
};

// Runs the configured jobs to completion (or failure, or the time limit).
Result<SimResult> Simulate(SimConfig config);

}  // namespace switchml::sim
