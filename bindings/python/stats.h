// ContextStats as the Python dict that switchml.Context.stats() and the torch group's stats()
// return (one key per field, the field's name).
#pragma once

#include <pybind11/pybind11.h>

#include "switchml/context.h"

namespace switchml::python {

inline pybind11::dict StatsDict(const ContextStats& s) {
  pybind11::dict d;
  d["packets_sent"] = s.packets_sent;
  d["packets_retransmitted"] = s.packets_retransmitted;
  d["timeouts"] = s.timeouts;
  d["results"] = s.results;
  d["duplicates_dropped"] = s.duplicates_dropped;
  d["stale_dropped"] = s.stale_dropped;
  d["malformed_dropped"] = s.malformed_dropped;
  d["rtt_samples"] = s.rtt_samples;
  d["backoffs"] = s.backoffs;
  d["srtt_us"] = s.srtt_us;
  d["rttvar_us"] = s.rttvar_us;
  d["rto_us"] = s.rto_us;
  d["foreign_source_dropped"] = s.foreign_source_dropped;
  d["auth_dropped"] = s.auth_dropped;
  d["datagrams_received"] = s.datagrams_received;
  d["group_datagrams_received"] = s.group_datagrams_received;
  d["coalesced_receives"] = s.coalesced_receives;
  d["switch_hosts_alive"] = s.switch_hosts_alive;
  d["failovers"] = s.failovers;
  d["blocks_repaired"] = s.blocks_repaired;
  d["sparse_allreduces"] = s.sparse_allreduces;
  d["sparse_blocks"] = s.sparse_blocks;
  d["sparse_own_blocks"] = s.sparse_own_blocks;
  d["sparse_union_blocks"] = s.sparse_union_blocks;
  d["sparse_dense_shares"] = s.sparse_dense_shares;
  d["sparse_aggregated_blocks"] = s.sparse_aggregated_blocks;
  return d;
}

}  // namespace switchml::python
