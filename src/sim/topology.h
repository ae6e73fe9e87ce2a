// The simulated network: nodes (worker hosts and switches) joined by directed links, each with a
// rate, a propagation delay, a buffer and seeded faults. A link graph, not a hard-wired star:
// switches may connect to switches (a two-level fabric is hosts -> ToR -> spine; aggregators on
// servers are switches behind one link each), and packets follow shortest paths (fewest hops; ties
// to the lowest link id), computed once.
//
// Addresses: node i has IPv4 address kNodeIpBase + i; a switch node's data plane listens on
// kSwitchPort. Pure data; no I/O.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "switchml/status.h"

namespace switchml::sim {

inline constexpr uint32_t kNodeIpBase = 0x0a000001;  // 10.0.0.1 is node 0
inline constexpr uint16_t kSwitchPort = 48864;

// Bounds of the simulation's timing parameters. The engine counts time in int64_t picoseconds
// (about 106 days): each delay at most kMaxDelayNs (1000 s) and the run at most kMaxSimSeconds
// keep every event time, a delay or a queue of delays past the limit included, far from
// overflow, where larger values had wrapped to negative times (a "simulated -9223372 s").
inline constexpr double kMaxDelayNs = 1e12;
inline constexpr double kMaxSimSeconds = 1e6;
// A link's rate, Gbit/s: at 1 Mbit/s a packet takes about 9 ms.
inline constexpr double kMinGbps = 1e-3;
inline constexpr double kMaxGbps = 1e6;
inline constexpr uint64_t kMaxBufferBytes = uint64_t{1} << 30;  // per link (1 GiB)
// Nodes (hosts and switches) of one topology: the routes are a table of nodes x nodes link ids
// (4 GiB at this bound), computed by a search from every node.
inline constexpr uint32_t kMaxNodes = 1u << 15;

struct LinkParams {
  double gbps = 100;            // line rate, kMinGbps..kMaxGbps
  double propagation_ns = 500;  // one-way propagation delay (cable, PHY, NIC), <= kMaxDelayNs
  // Output buffer of the link's transmitter: a packet that finds more than this many bytes queued
  // ahead of it is dropped (tail drop). 0: unbounded. At most kMaxBufferBytes.
  uint64_t buffer_bytes = 0;
  // Faults, each per packet and seeded (the simulation's seed, the link id and the packet's
  // sequence number on the link, so they do not depend on event order elsewhere).
  double loss = 0;       // dropped
  double duplicate = 0;  // delivered twice
  // Delivered after an extra uniform delay in [0, reorder_ns] (so out of order).
  double reorder = 0;
  double reorder_ns = 0;
  Status Validate() const;
};

struct Node {
  enum class Kind : uint8_t { kHost, kSwitch };
  Kind kind = Kind::kHost;
  std::string name;
};

struct Link {
  uint32_t from = 0;
  uint32_t to = 0;
  LinkParams params;
};

class Topology {
 public:
  uint32_t AddHost(std::string name);
  uint32_t AddSwitch(std::string name);
  // Adds the two directed links a <-> b with the same parameters; returns the id of a -> b
  // (b -> a is that id + 1).
  uint32_t Connect(uint32_t a, uint32_t b, const LinkParams& params);
  // Adds one directed link.
  uint32_t AddLink(uint32_t from, uint32_t to, const LinkParams& params);

  // One switch (node `hosts`) with `hosts` hosts (nodes 0 .. hosts-1) on links of `params`.
  static Topology Star(uint32_t hosts, const LinkParams& params);
  // Two levels: racks x hosts_per_rack hosts (nodes 0 .. racks * hosts_per_rack - 1, rack by
  // rack), each rack's hosts on its top-of-rack switch (node racks * hosts_per_rack + r) by `host`
  // links, every ToR on one spine (the last node) by an `uplink` link.
  static Topology TwoLevel(uint32_t racks, uint32_t hosts_per_rack, const LinkParams& host,
                           const LinkParams& uplink);
  // Aggregation on servers (issue 26): `hosts` hosts (nodes 0 .. hosts-1) on a switch that only
  // forwards, the fabric (node `hosts`), by `host` links, and `aggregators` switches that stand
  // for software switches on servers (nodes hosts+1 .. hosts+aggregators), each on the fabric by
  // its own `aggregator` link: a job striped over them (JobConfig::stripes) sends each packet
  // through the fabric to the aggregator of its slot, and every result comes back that way.
  static Topology ServerAggregators(uint32_t hosts, uint32_t aggregators, const LinkParams& host,
                                    const LinkParams& aggregator);

  const std::vector<Node>& nodes() const { return nodes_; }
  const std::vector<Link>& links() const { return links_; }
  std::vector<Link>& mutable_links() { return links_; }

  // Checks the links and computes the routes; every host must reach every switch; at most
  // kMaxNodes nodes. Call after the last change and before NextLink.
  Status Finalize();
  // The link to take from `at` toward `to` (at != to), or UINT32_MAX when unreachable.
  uint32_t NextLink(uint32_t at, uint32_t to) const {
    return next_link_[size_t{at} * nodes_.size() + to];
  }
  // The links of the path from a to b, in order (empty when a == b or unreachable).
  std::vector<uint32_t> Path(uint32_t a, uint32_t b) const;

  static uint32_t Ip(uint32_t node) { return kNodeIpBase + node; }

 private:
  std::vector<Node> nodes_;
  std::vector<Link> links_;
  std::vector<uint32_t> next_link_;  // nodes x nodes
};

}  // namespace switchml::sim
