#include "sim/topology.h"

#include <deque>

namespace switchml::sim {

namespace {
bool Probability(double p) { return p >= 0 && p <= 1; }
// The bounds as Validate's messages spell them.
static_assert(kMinGbps == 1e-3 && kMaxGbps == 1e6 && kMaxDelayNs == 1e12 &&
              kMaxBufferBytes == uint64_t{1} << 30 && kMaxNodes == 32768);
}  // namespace

Status LinkParams::Validate() const {
  if (!(gbps >= kMinGbps && gbps <= kMaxGbps)) {
    return InvalidArgumentError("link rate must be in [0.001, 1e6] Gbit/s");
  }
  if (!(propagation_ns >= 0 && propagation_ns <= kMaxDelayNs)) {
    return InvalidArgumentError("propagation delay must be in [0, 1e12] ns");
  }
  if (buffer_bytes > kMaxBufferBytes) {
    return InvalidArgumentError("link buffer must be at most 1 GiB (0: unbounded)");
  }
  if (!Probability(loss) || !Probability(duplicate) || !Probability(reorder)) {
    return InvalidArgumentError("loss, duplicate and reorder rates must be within [0, 1]");
  }
  if (!(reorder_ns >= 0 && reorder_ns <= kMaxDelayNs)) {
    return InvalidArgumentError("reorder delay must be in [0, 1e12] ns");
  }
  return Status();
}

uint32_t Topology::AddHost(std::string name) {
  nodes_.push_back(Node{Node::Kind::kHost, std::move(name)});
  return static_cast<uint32_t>(nodes_.size() - 1);
}

uint32_t Topology::AddSwitch(std::string name) {
  nodes_.push_back(Node{Node::Kind::kSwitch, std::move(name)});
  return static_cast<uint32_t>(nodes_.size() - 1);
}

uint32_t Topology::AddLink(uint32_t from, uint32_t to, const LinkParams& params) {
  links_.push_back(Link{from, to, params});
  return static_cast<uint32_t>(links_.size() - 1);
}

uint32_t Topology::Connect(uint32_t a, uint32_t b, const LinkParams& params) {
  const uint32_t id = AddLink(a, b, params);
  AddLink(b, a, params);
  return id;
}

Topology Topology::Star(uint32_t hosts, const LinkParams& params) {
  Topology t;
  for (uint32_t i = 0; i < hosts; ++i) t.AddHost("host" + std::to_string(i));
  const uint32_t sw = t.AddSwitch("switch");
  for (uint32_t i = 0; i < hosts; ++i) t.Connect(i, sw, params);
  return t;
}

Topology Topology::TwoLevel(uint32_t racks, uint32_t hosts_per_rack, const LinkParams& host,
                            const LinkParams& uplink) {
  Topology t;
  for (uint32_t i = 0; i < racks * hosts_per_rack; ++i) t.AddHost("host" + std::to_string(i));
  for (uint32_t r = 0; r < racks; ++r) t.AddSwitch("tor" + std::to_string(r));
  const uint32_t spine = t.AddSwitch("spine");
  for (uint32_t r = 0; r < racks; ++r) {
    const uint32_t tor = racks * hosts_per_rack + r;
    for (uint32_t i = 0; i < hosts_per_rack; ++i) t.Connect(r * hosts_per_rack + i, tor, host);
    t.Connect(tor, spine, uplink);
  }
  return t;
}

Topology Topology::ServerAggregators(uint32_t hosts, uint32_t aggregators, const LinkParams& host,
                                     const LinkParams& aggregator) {
  Topology t = Star(hosts, host);
  t.nodes_[hosts].name = "fabric";
  for (uint32_t a = 0; a < aggregators; ++a) {
    t.Connect(t.AddSwitch("aggregator" + std::to_string(a)), hosts, aggregator);
  }
  return t;
}

Status Topology::Finalize() {
  const size_t n = nodes_.size();
  if (n > kMaxNodes) {  // its route table would not fit (it ended in std::bad_alloc)
    return InvalidArgumentError("the topology has " + std::to_string(n) +
                                " nodes; at most 32768 (hosts and switches: the routes are a "
                                "table of nodes x nodes entries)");
  }
  for (size_t i = 0; i < links_.size(); ++i) {
    const Link& l = links_[i];
    if (l.from >= n || l.to >= n || l.from == l.to) {
      return InvalidArgumentError("link " + std::to_string(i) + " joins unknown nodes or a node " +
                                  "to itself");
    }
    Status st = l.params.Validate();
    if (!st.ok()) return InvalidArgumentError("link " + std::to_string(i) + ": " + st.message());
  }
  // Breadth-first search backwards from each destination: the first link found into a node on
  // the frontier is its next hop (links in id order, so ties go to the lowest id).
  std::vector<std::vector<uint32_t>> in(n);
  for (size_t i = 0; i < links_.size(); ++i) in[links_[i].to].push_back(static_cast<uint32_t>(i));
  next_link_.assign(n * n, UINT32_MAX);
  std::vector<uint32_t> dist(n);
  for (size_t dst = 0; dst < n; ++dst) {
    std::fill(dist.begin(), dist.end(), UINT32_MAX);
    dist[dst] = 0;
    std::deque<uint32_t> frontier{static_cast<uint32_t>(dst)};
    while (!frontier.empty()) {
      const uint32_t v = frontier.front();
      frontier.pop_front();
      for (uint32_t li : in[v]) {
        const uint32_t u = links_[li].from;
        if (dist[u] != UINT32_MAX) continue;
        dist[u] = dist[v] + 1;
        next_link_[u * n + dst] = li;
        frontier.push_back(u);
      }
    }
  }
  for (size_t h = 0; h < n; ++h) {
    if (nodes_[h].kind != Node::Kind::kHost) continue;
    for (size_t s = 0; s < n; ++s) {
      if (nodes_[s].kind != Node::Kind::kSwitch) continue;
      if (NextLink(h, s) == UINT32_MAX || NextLink(s, h) == UINT32_MAX) {
        return InvalidArgumentError("host " + nodes_[h].name + " and switch " + nodes_[s].name +
                                    " are not connected both ways");
      }
    }
  }
  return Status();
}

std::vector<uint32_t> Topology::Path(uint32_t a, uint32_t b) const {
  std::vector<uint32_t> path;
  while (a != b) {
    const uint32_t l = NextLink(a, b);
    if (l == UINT32_MAX) return {};
    path.push_back(l);
    a = links_[l].to;
  }
  return path;
}

}  // namespace switchml::sim
