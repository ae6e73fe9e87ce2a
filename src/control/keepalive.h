// Keepalive of the control plane's gRPC connections, one pair of values for the server
// (control_server.cc) and the client (control_client.cc) so that the two sides agree
// (docs/protocol.md 4.9 "Keepalive" and 4.10).
//
// Each side pings an idle connection every kKeepaliveTimeMs and closes it when a ping is not
// acknowledged within kKeepaliveTimeoutMs (gRPC's GRPC_ARG_KEEPALIVE_TIME_MS and
// GRPC_ARG_KEEPALIVE_TIMEOUT_MS; the next ping is sent a period after the previous one's
// acknowledgement). A process that dies is noticed at once without them (its kernel closes the
// connection); keepalive catches a host that vanishes without a FIN or RST, within about
// kKeepaliveTimeMs + kKeepaliveTimeoutMs = 11 s. The timeout is deliberately much longer than
// the period: a host that stalls for a few seconds (load, a VM's stolen time, a paused process)
// answers late but is alive, and a false failure kills a training job. 10 s is the data plane's
// default peer timeout (Config::retransmit.peer_timeout) too, so a stall the data plane rides
// out does not fail the job through the control plane. (It was 1 s, and a worker on a loaded
// 2-core VM lost its connection with "keepalive watchdog timeout".)
#pragma once

namespace switchml::control {

inline constexpr int kKeepaliveTimeMs = 1000;
inline constexpr int kKeepaliveTimeoutMs = 10000;

}  // namespace switchml::control
