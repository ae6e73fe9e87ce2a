// The `switchml` subcommands. Each takes its arguments after the command name and returns the
// process exit code (0 success, 1 the job failed, 2 bad usage or setup).
#pragma once

#include <string>
#include <vector>

namespace switchml::tools {

int SwitchCommand(const std::vector<std::string>& args);
int WorkerCommand(const std::vector<std::string>& args);
int RunCommand(const std::vector<std::string>& args, const std::string& self_exe);
int SimCommand(const std::vector<std::string>& args);
int StatusCommand(const std::vector<std::string>& args);

}  // namespace switchml::tools

#include <chrono>
#include <cstdint>

#include "base/endpoint.h"
#include "flags.h"
#include "switchml/config.h"
#include "switchml/types.h"

namespace switchml::tools {

// The largest --size, in elements (1024G: 4 TiB per buffer; beyond, its byte count could wrap).
constexpr uint64_t kMaxJobSize = uint64_t{1} << 40;

// --transport's value for "shm where this host's shared memory can be used, else udp": only for
// `run`, whose processes all share this host, which resolves it when it starts its switch.
inline constexpr const char* kAutoTransport = "auto";

// What a benchmark job is: shared by `worker` and `run` (which passes them on to its workers).
struct JobOptions {
  uint32_t workers = 2;
  uint64_t size = 0;
  DataType dtype = DataType::kFloat32;
  uint32_t iterations = 5;
  uint32_t warmup = 1;
  uint32_t threads = 1;
  uint32_t packet_numel = 256;
  uint32_t window = 0;  // 0 until ReadJobFlags resolves the automatic window
  // `run` only: --threads 0 and --window 0 were given (or defaulted): ResolveAutomaticJobOptions
  // picks them once the transport is known.
  bool threads_automatic = false;
  bool window_automatic = false;
  double link_gbps = 10;
  int64_t base_rtt_us = 100;
  int64_t timeout_ms = 10;
  int64_t min_timeout_us = 10000;
  int64_t max_timeout_ms = 1000;
  int64_t early_retransmit = 0;  // Config::retransmit.early_retransmit_after
  int64_t peer_timeout_ms = 10000;
  int64_t setup_timeout_ms = 30000;
  uint64_t seed = 1;
  bool verify = true;
  std::string transport = "udp";  // data-plane transport of the workers (and of `run`'s switch);
                                  // kAutoTransport only from `run`'s flags, resolved by `run`
  WaitOptions wait;               // Config::wait (--busy-poll, --wake-batch)
  // Config::pin_threads (and `run`'s switch's); `run` only: --pin-threads auto, resolved by
  // ResolveAutomaticJobOptions (on over shm where --threads equals the CPUs this process may use).
  bool pin_threads = false;
  bool pin_threads_automatic = false;
  bool tensor_check = true;  // Config::check_tensors
  bool auth_data = false;    // Config::authenticate_data
  bool sparse = false;       // Config::sparse (block-sparse all-reduces)
  bool sparse_auto = false;  // Config::sparse_auto (with sparse: the automatic choice)
  // The input pattern's block density and overlap (testing::Pattern; for benchmarks of --sparse).
  double density = 1;
  double overlap = 1;
  bool loopback_multicast = true;       // Config::loopback_multicast (--multicast auto, local, on)
  bool lan_multicast = true;            // Config::lan_multicast (--multicast auto or on)
  bool lan_multicast_required = false;  // Config::lan_multicast_required (--multicast on)
};

// --dpdk-eal and --dpdk-device as given: the dpdk transport's EAL arguments and device.
struct DpdkFlags {
  std::string eal;
  std::string device;
};

// The job's flags as given on the command line (AddJobFlags binds them; ReadJobFlags checks them
// into a JobOptions). Whole numbers stay int64_t here so that ranges are checked before they
// narrow.
struct JobFlags {
  // `run`'s: --transport defaults to kAutoTransport, --threads to 0 and --pin-threads is
  // on/off/auto (set by AddJobFlags).
  bool auto_transport = false;
  int64_t workers = 2;
  Size size{1 << 20};
  std::string dtype = "float32";
  int64_t iterations = 5;
  int64_t warmup = 1;
  int64_t threads = 1;  // 0 (automatic) by default where auto_transport
  int64_t window = 0;
  double link_gbps = 10;
  int64_t base_rtt_us = 100;
  int64_t packet_numel = 256;
  int64_t timeout_ms = 10;
  int64_t min_timeout_us = 10000;
  int64_t max_timeout_ms = 1000;
  int64_t early_retransmit = 0;
  int64_t peer_timeout_ms = 10000;
  int64_t setup_timeout_ms = 30000;
  int64_t seed = 1;
  bool no_verify = false;
  std::string transport;  // set by AddJobFlags
  bool busy_poll = false;
  bool pin_threads = false;               // --pin-threads without auto_transport
  std::string pin_threads_mode = "auto";  // --pin-threads on/off/auto with auto_transport
  double wake_batch = 0;
  bool no_tensor_check = false;
  bool auth_data = false;
  bool sparse = false;
  bool sparse_auto = false;
  double density = 1;
  double overlap = 1;
  std::string multicast = "auto";
  bool no_loopback_multicast = false;
  DpdkFlags dpdk;
};

// A control-plane client's TLS flags as given (`worker`, `status`): --tls-ca, --tls-cert,
// --tls-key, --tls-server-name.
struct TlsClientFlags {
  std::string ca, cert, key, server_name;
};
void AddTlsClientFlags(Flags* flags, TlsClientFlags* t);

// Binds the job's flags to *j. `auto_transport`: --transport defaults to kAutoTransport (`run`)
// instead of udp, and only then accepts "auto" (the other commands refuse it).
void AddJobFlags(Flags* flags, JobFlags* j, bool auto_transport = false);
// The help line of --transport, listing the kinds.
std::string TransportHelp();
// Binds --dpdk-eal and --dpdk-device; ApplyDpdkFlags sets SWITCHML_DPDK_EAL /
// SWITCHML_DPDK_DEVICE from those given, which the processes `run` starts inherit.
void AddDpdkFlags(Flags* flags, DpdkFlags* d);
void ApplyDpdkFlags(const DpdkFlags& d);
// Checks a --transport value: a transport kind, or kAutoTransport where auto_transport.
Status CheckTransportFlag(const std::string& kind, bool auto_transport);
// Checks --seed into *out; negative values are refused (not wrapped to 2^64 - n, which no
// command line could give back: the flag parser reads at most 2^63 - 1).
Status ReadSeed(int64_t seed, uint64_t* out);
// Checks the flags AddJobFlags bound into *out; errors say which flag is wrong.
Status ReadJobFlags(const JobFlags& flags, JobOptions* out);
// The worker threads `run` uses over shm when --threads is 0 (automatic) on a host with at least
// that many cores (else 1; over the other transports 1): the switch's data-plane work then
// spreads over the cores too (`run`'s switch gets as many threads; docs/benchmarks.md).
inline constexpr uint32_t kShmRunThreads = 2;
// Resolves --threads 0 (`run`: kShmRunThreads over shm where the host has the cores, else 1),
// --pin-threads auto (on over shm where the threads equal the CPUs this process may use) and
// --window 0 (Config::OutstandingPackets() for o->transport and o->threads) in *o.
void ResolveAutomaticJobOptions(JobOptions* o);
// Copies the window (max_outstanding_packets, link_gbps, base_rtt) and the retransmission
// timeout's options (timeout, min_timeout, max_timeout) into *config.
void ApplyPacingOptions(const JobOptions& o, Config* config);
// The flags that reproduce `o` for a `switchml worker` command line.
std::vector<std::string> JobFlagArgs(const JobOptions& o);
// --switch: "HOST[:PORT]" or a comma-separated list of them (a job striped over several switch
// hosts), each resolved; a host listed twice (after resolution) is refused.
Result<std::vector<Endpoint>> ParseSwitchList(const std::string& text);

// Parses a command's flags, checks the job's (bound by AddJobFlags to *job_flags) into *job when
// job is not null, and applies `log_level` (the variable the command bound --log-level to).
// Returns -1 to go on, or the exit code to return at once: 0 after printing --help, 2 after
// printing what is wrong with the command line.
int ParseCommandLine(const std::string& command, const std::vector<std::string>& args, Flags* flags,
                     const std::string& log_level, const JobFlags* job_flags = nullptr,
                     JobOptions* job = nullptr);

}  // namespace switchml::tools
