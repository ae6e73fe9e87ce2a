// SwitchHosts: the switch hosts of the tests that stripe jobs over several real Switches in
// virtual time (striping_test.cc, sparse_test.cc): host h's switch at HostEndpoint(h), any one
// of them killable. Header-only, for tests.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "base/endpoint.h"
#include "dataplane/switch.h"
#include "testing/virtual_network.h"

namespace switchml::testing {

struct SwitchHosts {
  static Endpoint HostEndpoint(uint32_t h) { return Endpoint{0x0a00ff01 + h, 48864}; }

  // Delivers `e` when it is addressed to a switch host: that switch processes it (nothing, once
  // the host is dead) and its replies go into `net` at `now`. Also swallows what a dead host
  // had in flight. Returns whether `e` was a switch host's, either way.
  bool Deliver(const VirtualNetwork::Event& e, VirtualNetwork& net, Nanos now) {
    for (uint32_t h = 0; h < switches.size(); ++h) {
      if (e.to != HostEndpoint(h)) continue;
      if (static_cast<int>(h) == dead) return true;  // gone
      const dataplane::Action& a = switches[h]->Process(e.from, e.data);
      if (a.kind == dataplane::Action::Kind::kDrop) return true;
      const std::vector<uint8_t> reply(a.reply.begin(), a.reply.end());
      const std::vector<Endpoint> dsts(a.destinations.begin(), a.destinations.end());
      for (const Endpoint& d : dsts) net.Send(now, HostEndpoint(h), d, reply);
      return true;
    }
    return dead >= 0 && e.from == HostEndpoint(static_cast<uint32_t>(dead));  // in flight
  }

  std::vector<std::unique_ptr<dataplane::Switch>> switches;
  int dead = -1;  // the host killed, or -1
};

}  // namespace switchml::testing
