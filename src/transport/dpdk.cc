#include "transport/dpdk.h"

#ifndef SWITCHML_HAVE_DPDK

namespace switchml::transport {

bool DpdkAvailable() { return false; }

Result<std::vector<std::unique_ptr<Transport>>> OpenDpdkConsecutive(const TransportOptions&,
                                                                    size_t) {
  return UnimplementedError(
      "transport 'dpdk' is not in this build: libdpdk-dev (pkg-config libdpdk) was not found when "
      "it was configured; install it (scripts/setup.sh) and configure again");
}

}  // namespace switchml::transport

#else  // SWITCHML_HAVE_DPDK

#include <fcntl.h>
#include <linux/futex.h>
#include <pthread.h>
#include <rte_alarm.h>
#include <rte_arp.h>
#include <rte_dev.h>
#include <rte_eal.h>
#include <rte_errno.h>
#include <rte_ethdev.h>
#include <rte_ether.h>
#include <rte_flow.h>
#include <rte_ip.h>
#include <rte_lcore.h>
#include <rte_mbuf.h>
#include <rte_mempool.h>
#include <rte_prefetch.h>
#include <rte_udp.h>
#include <rte_version.h>
#include <sched.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#include <optional>
#include <random>
#include <sstream>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "base/endpoint.h"
#include "base/logging.h"
#include "base/status_macros.h"
#include "transport/checksum.h"
#include "transport/frame.h"
#include "transport/private_dir.h"
#include "transport/udp.h"

namespace switchml::transport {
namespace {

constexpr size_t kHeaderBytes =
    sizeof(rte_ether_hdr) + sizeof(rte_ipv4_hdr) + sizeof(rte_udp_hdr);  // 42
constexpr size_t kMaxPayload = 2048;
static_assert(kMaxPayload == kDpdkMaxDatagramBytes);
// Each mbuf: headroom, then headers and the largest datagram, rounded up to cache lines. memif's
// packet buffers (bsize) have exactly this size, so that its receive path copies a frame into
// one mbuf and its transmit path copies one mbuf into one buffer (its fast paths, taken only
// when the two sizes agree).
constexpr uint16_t kFrameRoom = (kHeaderBytes + kMaxPayload + 63) / 64 * 64;  // 2112
constexpr uint16_t kDataRoom = RTE_PKTMBUF_HEADROOM + kFrameRoom;
constexpr const char* kMemifBufferArg = ",bsize=2112";
static_assert(kFrameRoom == 2112, "kMemifBufferArg must name kFrameRoom");
constexpr uint16_t kRingSize = 1024;
// EAL applies the first --log-level pattern that matches a log type: memif's comes first. Without
// it memif warns, on every device, that --no-shconf leaves it no multi-process channel.
constexpr const char* kDefaultEal =
    "--no-huge --no-pci --no-shconf -m 512 --no-telemetry --log-level=pmd.net.memif:error "
    "--log-level=*:warning";
constexpr std::chrono::seconds kLinkTimeout{10};

// The directory of the doorbells and memif id locks: this user's own (private_dir.h; issue 28,
// found 2 and 3: the shared /tmp/switchml-dpdk, mode 1777, let other users redirect a root
// switch's writes through symbolic links and hold its workers' id locks). Opened and checked
// once per process, at `path` (DpdkOptions::lock_dir, $SWITCHML_DPDK_LOCK_DIR; empty: the
// default) as the first call gives it.
Result<const PrivateDirectory*> LockDir(const std::string& path) {
  static std::mutex mu;
  static std::optional<PrivateDirectory> dir;
  std::lock_guard lock(mu);
  if (!dir) {
    ASSIGN_OR_RETURN(
        PrivateDirectory d,
        PrivateDirectory::Open(PrivateDirectoryPath("dpdk", path),
                               "DPDK memif doorbell and id-lock files", "SWITCHML_DPDK_LOCK_DIR"));
    dir.emplace(std::move(d));
  }
  return &*dir;
}

// ---------------------------------------------------------------------------------------------
// Process-wide state: EAL, the mbuf pool, the devices made so far. EAL can be initialised once
// per process and outlives every transport, so all of it lives here, in Process (reached through
// Proc(), under Process::mu for the devices), InitEal (once, on the first open) and
// RegisterThread (once per thread); the transports and OpenDpdkConsecutive's steps below only
// use it. Nothing else in this file keeps state across transports.

struct Process {
  std::once_flag once;
  Status eal_status;
  std::string eal_args;
  rte_mempool* pool = nullptr;
  std::recursive_mutex mu;  // device creation, configuration and removal
  uint32_t next_vdev = 0;
  std::unordered_map<std::string, uint16_t> devices_in_use;  // device text -> port (device mode)
  // memif server sockets by name, kept for the life of the process (see TakeMemifServer).
  struct MemifServer {
    struct Id {
      uint16_t port = RTE_MAX_ETHPORTS;  // RTE_MAX_ETHPORTS: no device
      std::string vdev;
      bool configured = false;  // StartPort succeeded once
      bool in_use = false;      // a transport holds it (started); else stopped
    };
    std::string prefix;  // the socket name is prefix-udp_port
    uint16_t udp_port = 0;
    std::vector<Id> ids;  // by memif id; while the socket is free only id 0 has a device
    std::unique_ptr<Transport> reservation;  // while free: the kernel UDP port, kept
  };
  std::unordered_map<std::string, MemifServer> memif_servers;
  // The pool's memory chunks [begin, end), for LentSlot's range check.
  std::vector<std::pair<uintptr_t, uintptr_t>> pool_memory;
  bool InPool(uintptr_t a, size_t len) const {
    for (const auto& [b, e] : pool_memory) {
      if (a >= b && a + len <= e) return true;
    }
    return false;
  }
};

Process& Proc() {
  static Process* p = new Process;  // never destroyed: EAL outlives every transport
  return *p;
}

std::vector<std::string> SplitArgs(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  std::string a;
  while (in >> a) out.push_back(a);
  return out;
}

// `eal_args`: DpdkOptions::eal_args of the process's first open (empty: kDefaultEal).
Status InitEal(const std::string& eal_args) {
  Process& p = Proc();
  std::call_once(p.once, [&p, &eal_args] {
    const std::string args = eal_args.empty() ? std::string(kDefaultEal) : eal_args;
    p.eal_args = args;
    std::vector<std::string> words = SplitArgs(args);
    words.insert(words.begin(), "switchml");
    std::vector<char*> argv;
    for (std::string& w : words) argv.push_back(w.data());
    argv.push_back(nullptr);
    cpu_set_t saved;
    const bool have_saved = sched_getaffinity(0, sizeof(saved), &saved) == 0;
    const int r = rte_eal_init(static_cast<int>(words.size()), argv.data());
    // EAL pins the calling thread to its main lcore: give it (and the threads it starts later)
    // the whole machine back, the transports' threads are not EAL workers.
    if (have_saved) sched_setaffinity(0, sizeof(saved), &saved);
    if (r < 0) {
      const int e = rte_errno;
      std::string why = rte_strerror(e);
      StatusCode code = StatusCode::kFailedPrecondition;
      std::string hint;
      if (e == EACCES || e == EPERM) hint = " (permissions: run as root or with CAP_SYS_ADMIN)";
      if (e == EALREADY) hint = " (EAL was initialised by someone else in this process)";
      p.eal_status =
          Status(code, "DPDK EAL initialisation failed with arguments '" + args + "': " + why +
                           hint + " (set SWITCHML_DPDK_EAL or --dpdk-eal to change them)");
      return;
    }
    // One pool per process for every transport: receive rings, transmit buffers, ARP replies.
    const unsigned n = 32767;
    p.pool = rte_pktmbuf_pool_create("switchml_mbufs", n, 256, 0, kDataRoom,
                                     static_cast<int>(rte_socket_id()));
    if (p.pool == nullptr) {
      p.eal_status = ResourceExhaustedError(
          std::string("DPDK: cannot create the mbuf pool (") + rte_strerror(rte_errno) +
          "): give EAL more memory (-m) in SWITCHML_DPDK_EAL / --dpdk-eal");
      return;
    }
    rte_mempool_mem_iter(
        p.pool,
        [](rte_mempool*, void* arg, rte_mempool_memhdr* h, unsigned) {
          const auto b = reinterpret_cast<uintptr_t>(h->addr);
          static_cast<Process*>(arg)->pool_memory.emplace_back(b, b + h->len);
        },
        &p);
    LOG(kInfo, kTransport) << "DPDK EAL up (" << rte_version() << ") with '" << args << "'";
  });
  return p.eal_status;
}

// A thread that uses a transport registers once, so that the mempool gives it a per-lcore cache.
void RegisterThread() {
  thread_local bool done = false;
  if (done) return;
  done = true;
  prctl(PR_SET_TIMERSLACK, 1000UL);  // naps of tens of microseconds: 1 us slack, not 50
  if (rte_lcore_id() == LCORE_ID_ANY) {
    cpu_set_t saved;
    const bool have = pthread_getaffinity_np(pthread_self(), sizeof(saved), &saved) == 0;
    if (rte_thread_register() != 0) {
      LOG(kDebug, kTransport) << "rte_thread_register: " << rte_strerror(rte_errno)
                              << " (no mempool cache for this thread)";
    }
    if (have) pthread_setaffinity_np(pthread_self(), sizeof(saved), &saved);
  }
}

// End of the process-wide state.
// ---------------------------------------------------------------------------------------------

std::string MacToString(const rte_ether_addr& a) {
  char buf[RTE_ETHER_ADDR_FMT_SIZE];
  rte_ether_format_addr(buf, sizeof(buf), &a);
  return buf;
}

// Static neighbours (DpdkOptions::neighbours, from SWITCHML_DPDK_NEIGH).
std::unordered_map<uint32_t, rte_ether_addr> StaticNeighbours(
    const std::vector<DpdkNeighbour>& given) {
  std::unordered_map<uint32_t, rte_ether_addr> out;
  for (const DpdkNeighbour& n : given) {
    rte_ether_addr mac;
    std::memcpy(mac.addr_bytes, n.mac.data(), RTE_ETHER_ADDR_LEN);
    out[n.ipv4] = mac;
  }
  return out;
}

Status WaitLinkUp(uint16_t port, const std::string& what, std::chrono::nanoseconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (true) {
    rte_eth_link link{};
    if (rte_eth_link_get_nowait(port, &link) == 0 && link.link_status == RTE_ETH_LINK_UP) {
      return Status();
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      return UnavailableError(
          what + ": link not up after " +
          std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(limit).count()) +
          " ms");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

// Configures and starts a port with `queues` rx/tx queue pairs. Offloads: IPv4 and UDP transmit
// checksums where the device has them. Fills *tx_offloads with what was enabled.
Status StartPort(uint16_t port, uint16_t queues, const std::string& what, uint64_t* tx_offloads,
                 uint64_t* rx_offloads) {
  rte_eth_dev_info info{};
  if (int r = rte_eth_dev_info_get(port, &info); r != 0) {
    return InternalError(what + ": rte_eth_dev_info_get: " + rte_strerror(-r));
  }
  if (info.max_rx_queues < queues || info.max_tx_queues < queues) {
    return FailedPreconditionError(what + " (" + info.driver_name + ") has " +
                                   std::to_string(info.max_rx_queues) + " receive queues, " +
                                   std::to_string(queues) + " threads need as many: use fewer");
  }
  rte_eth_conf conf{};
  const uint64_t want_tx = RTE_ETH_TX_OFFLOAD_IPV4_CKSUM | RTE_ETH_TX_OFFLOAD_UDP_CKSUM;
  const uint64_t want_rx = RTE_ETH_RX_OFFLOAD_IPV4_CKSUM | RTE_ETH_RX_OFFLOAD_UDP_CKSUM;
  conf.txmode.offloads = info.tx_offload_capa & want_tx;
  conf.rxmode.offloads = info.rx_offload_capa & want_rx;
  if (conf.txmode.offloads != want_tx) conf.txmode.offloads = 0;  // both or neither
  *tx_offloads = conf.txmode.offloads;
  *rx_offloads = conf.rxmode.offloads;
  if (int r = rte_eth_dev_configure(port, queues, queues, &conf); r != 0) {
    return FailedPreconditionError(what + ": rte_eth_dev_configure: " + rte_strerror(-r));
  }
  uint16_t rx_ring = kRingSize, tx_ring = kRingSize;
  rte_eth_dev_adjust_nb_rx_tx_desc(port, &rx_ring, &tx_ring);
  const int socket = rte_eth_dev_socket_id(port);
  for (uint16_t q = 0; q < queues; ++q) {
    rte_eth_rxconf rxc = info.default_rxconf;
    rxc.offloads = conf.rxmode.offloads;
    if (int r = rte_eth_rx_queue_setup(port, q, rx_ring, socket < 0 ? SOCKET_ID_ANY : socket, &rxc,
                                       Proc().pool);
        r != 0) {
      return FailedPreconditionError(what + ": rx queue " + std::to_string(q) + ": " +
                                     rte_strerror(-r));
    }
    rte_eth_txconf txc = info.default_txconf;
    txc.offloads = conf.txmode.offloads;
    if (int r = rte_eth_tx_queue_setup(port, q, tx_ring, socket < 0 ? SOCKET_ID_ANY : socket, &txc);
        r != 0) {
      return FailedPreconditionError(what + ": tx queue " + std::to_string(q) + ": " +
                                     rte_strerror(-r));
    }
  }
  if (int r = rte_eth_dev_start(port); r != 0) {
    return FailedPreconditionError(what + ": rte_eth_dev_start: " + rte_strerror(-r));
  }
  rte_eth_promiscuous_enable(port);  // frames for our IP, whatever MAC the peer used
  return Status();
}

// Creates a virtual device "name,args" and returns its port.
Result<uint16_t> MakeVdev(const std::string& name, const std::string& args,
                          const std::string& what) {
  if (int r = rte_eal_hotplug_add("vdev", name.c_str(), args.c_str()); r != 0) {
    std::string hint;
    if (r == -EEXIST) hint = " (exists already)";
    return FailedPreconditionError(
        what + ": cannot create DPDK device " + name + "," + args + ": " + rte_strerror(-r) + hint +
        " (is the driver installed, e.g. librte-net-memif23 / librte-net-af-packet23? the log "
        "above has the driver's message)");
  }
  uint16_t port;
  if (rte_eth_dev_get_port_by_name(name.c_str(), &port) != 0) {
    return InternalError(what + ": device " + name + " made but has no port");
  }
  return port;
}

// Runs `fn` on EAL's interrupt thread (as an alarm) and waits for it. net_memif handles its
// control messages there (a peer's connect and disconnect), and its disconnect frees the regions
// and the control channel without a lock: a memif device stopped or closed from another thread
// while the interrupt thread handles the peer's disconnect freed them twice ("EAL: Error: Invalid
// memory", then a segfault in eal-intr-thread). On that thread the two are serialised.
//
// The hand-over is ordered by call.mu alone: this thread holds it from before the alarm is set
// until the wait releases it, and the alarm takes it before it reads anything of the call (`fn`
// and what it captures, written by this thread) and runs `fn` under it. EAL's alarm list has a
// lock of its own, but one in DPDK's (uninstrumented) code: the order it gives is not one the
// C++ memory model (or ThreadSanitizer) can see, so the call must not rely on it.
void OnInterruptThread(const std::function<void()>& fn) {
  struct Call {
    const std::function<void()>* fn;
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
  } call{&fn, {}, {}};
  auto run = [](void* arg) {
    auto* c = static_cast<Call*>(arg);
    std::lock_guard<std::mutex> lock(c->mu);
    (*c->fn)();
    c->done = true;
    c->cv.notify_one();
  };
  std::unique_lock<std::mutex> lock(call.mu);
  if (rte_eal_alarm_set(1, run, &call) != 0) {
    fn();  // no alarm: as before
    return;
  }
  call.cv.wait(lock, [&call] { return call.done; });
}

// Stops a port; a memif one on the interrupt thread (see OnInterruptThread).
void StopPort(uint16_t port, bool memif) {
  if (memif) {
    OnInterruptThread([port] { rte_eth_dev_stop(port); });
  } else {
    rte_eth_dev_stop(port);
  }
}

void ClosePort(uint16_t port, const std::string& vdev_name) {
  auto close = [&] {
    rte_eth_dev_stop(port);
    rte_eth_dev_close(port);
    if (!vdev_name.empty()) rte_eal_hotplug_remove("vdev", vdev_name.c_str());
  };
  if (vdev_name.rfind("net_memif", 0) == 0) {
    OnInterruptThread(close);
  } else {
    close();
  }
}

// memif server sockets are never freed. DPDK 22.11's net_memif, on removing the last device of a
// server socket, frees the socket and its interrupt handle but neither unregisters the listener's
// interrupt callback nor closes the listening fd (memif_socket_remove_device): the abstract socket
// stays bound (a later server of the same name fails with "Address already in use") and EAL's
// interrupt thread keeps a callback on freed memory (crashes, heap corruption). So the device of
// id 0 of a server socket, once made, stays for the life of the process, and with it the socket,
// its listener and the UDP port reserved for it: a transport that goes stops that device (which
// disconnects its client and drops the rings with any frames in them) and removes the others
// (safe: the socket keeps a device); the next switch-side transport takes a free socket (the same
// port, or any when the port is ephemeral) and starts it again. Called with Proc().mu held.
Result<uint16_t> TakeMemifServer(const std::string& sock, uint32_t id, const std::string& args,
                                 const std::string& what) {
  Process& proc = Proc();
  Process::MemifServer& server = proc.memif_servers.at(sock);
  if (id >= server.ids.size()) server.ids.resize(id + 1);
  Process::MemifServer::Id& s = server.ids[id];
  if (s.in_use) return FailedPreconditionError(what + ": served already in this process");
  if (s.port == RTE_MAX_ETHPORTS) {
    const std::string vdev =
        "net_memif_s" + std::to_string(getpid()) + "_" + std::to_string(proc.next_vdev++);
    ASSIGN_OR_RETURN(s.port, MakeVdev(vdev, args, what));
    s.vdev = vdev;
  }
  uint64_t tx_off, rx_off;
  if (!s.configured) {
    RETURN_IF_ERROR(StartPort(s.port, 1, what, &tx_off, &rx_off));
    s.configured = true;
  } else {
    // Start, stop and start: a stopped server still accepts a client on its listener; the stop
    // disconnects any that came while nobody served the socket, so the new transport starts clean.
    for (int i = 0; i < 3; ++i) {
      if (i == 1) {
        StopPort(s.port, true);
        continue;
      }
      if (int r = rte_eth_dev_start(s.port); r != 0) {
        return FailedPreconditionError(what + ": rte_eth_dev_start: " + rte_strerror(-r));
      }
    }
    rte_eth_stats_reset(s.port);
  }
  s.in_use = true;
  return s.port;
}

// Gives back a device taken by TakeMemifServer: id 0 stopped and kept, the others removed (the
// socket keeps id 0's device, so removing them frees nothing of it). Called with Proc().mu held.
void ReleaseMemifServer(const std::string& sock, uint32_t id) {
  Process::MemifServer::Id& s = Proc().memif_servers.at(sock).ids.at(id);
  if (id == 0) {
    if (s.in_use) StopPort(s.port, true);
    s.in_use = false;
    return;
  }
  ClosePort(s.port, s.vdev);
  s = Process::MemifServer::Id();
}

// Takes the kernel port reservations of `count` free memif server sockets prefix-P..P+count-1
// (P = `port`, or any when 0); empty when there are none. Called with Proc().mu held.
std::vector<std::unique_ptr<Transport>> TakeFreeMemifSockets(const std::string& prefix,
                                                             uint16_t port, size_t count) {
  auto& servers = Proc().memif_servers;
  auto free_at = [&](uint32_t p) -> Process::MemifServer* {
    if (p > 65535) return nullptr;
    auto it = servers.find(prefix + "-" + std::to_string(p));
    return it != servers.end() && it->second.reservation != nullptr ? &it->second : nullptr;
  };
  for (auto& [name, server] : servers) {
    if (server.prefix != prefix || server.reservation == nullptr) continue;
    if (port != 0 && server.udp_port != port) continue;
    size_t k = 1;
    while (k < count && free_at(server.udp_port + k) != nullptr) ++k;
    if (k < count) continue;
    std::vector<std::unique_ptr<Transport>> out;
    for (k = 0; k < count; ++k) out.push_back(std::move(free_at(server.udp_port + k)->reservation));
    return out;
  }
  return {};
}

// ---------------------------------------------------------------------------------------------
// Doorbells: how a memif receiver sleeps without missing frames, and without the sender paying a
// system call while the receiver is awake.
//
// net_memif in DPDK 22.11 has no receive interrupts for the application (no
// rte_eth_dev_rx_intr_enable), so each memif transport keeps a doorbell of its own: two words in
// a small file in LockDir() that it and its peers map (MAP_SHARED). A receiver that found
// nothing announces that it sleeps (`sleeping`), polls once more, and waits on `seq` (a futex
// shared between processes); a sender checks `sleeping` after every transmit burst and only then
// bumps `seq` and wakes the futex (the first sender to see the flag clears it). Both sides put a
// full fence between their store and their load (the ring's head or tail, the flag), so either
// the receiver's last poll sees the frames or the sender sees the flag. The files: the memif
// server's transport rings "<socket>.bell", a client's "<socket>.<id>.lock" (its id lock, made
// one page long). A peer without doorbells is never rung: the sleeps are capped
// (10 ms, DpdkOptions::max_sleep) so that it is only slower, never stuck.
struct BellWords {
  std::atomic<uint32_t> seq{0};       // the futex word: bumped by every ring
  std::atomic<uint32_t> sleeping{0};  // the owner sleeps, or is about to: ring it
};
static_assert(std::atomic<uint32_t>::is_always_lock_free && sizeof(BellWords) == 8,
              "the doorbell is shared between processes: two plain 32-bit words");
constexpr size_t kBellFileBytes = 4096;

// A mapped doorbell (or one in private memory, for a transport without peers that ring it).
class Bell {
 public:
  Bell() : words_(new BellWords) {}  // private: only Wake() rings it
  ~Bell() {
    if (mapped_) {
      munmap(words_, kBellFileBytes);
    } else {
      delete words_;
    }
  }
  Bell(const Bell&) = delete;
  Bell& operator=(const Bell&) = delete;

  // Maps the doorbell in file `name` of the lock directory (LockDir(lock_dir)), made (zero:
  // nobody sleeps) when it does not exist.
  static Result<std::unique_ptr<Bell>> Map(const std::string& lock_dir, const std::string& name) {
    ASSIGN_OR_RETURN(const PrivateDirectory* dir, LockDir(lock_dir));
    Result<int> opened = dir->OpenFile(name, O_RDWR);
    if (!opened.ok()) {
      return FailedPreconditionError("dpdk memif doorbell: " + opened.status().message());
    }
    return Map(*opened, dir->path() + "/" + name, /*own_fd=*/true);
  }
  // The same from an open descriptor of the file (`path` names it in errors); closes it when
  // `own_fd`.
  static Result<std::unique_ptr<Bell>> Map(int fd, const std::string& path, bool own_fd) {
    struct stat st {};
    void* at = MAP_FAILED;
    std::string why;
    if (fstat(fd, &st) != 0) {
      why = "fstat";
    } else if (st.st_size < static_cast<off_t>(kBellFileBytes) &&
               ftruncate(fd, kBellFileBytes) != 0) {  // grows with zeros; never shrinks
      why = "ftruncate";
    } else {
      at = mmap(nullptr, kBellFileBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
      if (at == MAP_FAILED) why = "mmap";
    }
    const int err = errno;
    if (own_fd) close(fd);
    if (at == MAP_FAILED) {
      return FailedPreconditionError("dpdk memif doorbell " + path + ": " + why + ": " +
                                     strerror(err));
    }
    auto b = std::unique_ptr<Bell>(new Bell(static_cast<BellWords*>(at)));
    return b;
  }

  // The sender's side, after frames were handed to the peer's ring.
  void RingIfSleeping() {
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (words_->sleeping.load(std::memory_order_relaxed) == 0) return;
    if (words_->sleeping.exchange(0, std::memory_order_relaxed) == 0) return;  // rung already
    Ring();
  }

  // Wakes the owner whether it sleeps or not (Wake()).
  void Ring() {
    words_->seq.fetch_add(1, std::memory_order_release);
    syscall(SYS_futex, &words_->seq, FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
  }

  // The owner's side: announces the sleep and returns the word to wait on. The caller polls once
  // more after this, then calls Sleep with the value (or Awake when that poll found frames).
  uint32_t PrepareSleep() {
    words_->sleeping.store(1, std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_seq_cst);
    return words_->seq.load(std::memory_order_acquire);
  }
  void Sleep(uint32_t seen, std::chrono::nanoseconds limit) {
    const timespec ts{static_cast<time_t>(limit.count() / 1000000000),
                      static_cast<long>(limit.count() % 1000000000)};
    syscall(SYS_futex, &words_->seq, FUTEX_WAIT, seen, &ts, nullptr, 0);
    Awake();
  }
  void Awake() { words_->sleeping.store(0, std::memory_order_relaxed); }

 private:
  explicit Bell(BellWords* mapped) : words_(mapped), mapped_(true) {}
  BellWords* words_;
  bool mapped_ = false;
};

std::string IdLockName(const std::string& sock, uint32_t id) {
  return sock + "." + std::to_string(id) + ".lock";
}
std::string BellName(const std::string& sock) { return sock + ".bell"; }

// An id lock for a memif client: the first free id of socket `sock`.
struct IdLock {
  int fd = -1;
  uint32_t id = 0;
  std::string path;
  ~IdLock() {
    if (fd >= 0) close(fd);
  }
};

Result<std::unique_ptr<IdLock>> TakeId(const std::string& lock_dir, const std::string& sock,
                                       uint32_t max_ids) {
  ASSIGN_OR_RETURN(const PrivateDirectory* dir, LockDir(lock_dir));
  for (uint32_t id = 0; id < max_ids; ++id) {
    auto lock = std::make_unique<IdLock>();
    lock->path = dir->path() + "/" + IdLockName(sock, id);
    Result<int> opened = dir->OpenFile(IdLockName(sock, id), O_RDWR);
    if (!opened.ok()) return FailedPreconditionError("memif: " + opened.status().message());
    lock->fd = *opened;
    if (flock(lock->fd, LOCK_EX | LOCK_NB) == 0) {
      lock->id = id;
      return lock;
    }
  }
  return ResourceExhaustedError("memif: all " + std::to_string(max_ids) + " ids of " + sock +
                                " are taken by running processes");
}

// ---------------------------------------------------------------------------------------------

// A started port; closed (and a virtual device removed) when the last transport using it goes.
struct Device {
  uint16_t port = 0;
  std::string vdev;          // the virtual device to remove ("" for a PCI port)
  std::string key;           // its entry in Process::devices_in_use ("" for memif)
  std::string memif_server;  // a memif server's socket: kept, only stopped (TakeMemifServer)
  uint32_t memif_id = 0;
  ~Device() {
    if (port == RTE_MAX_ETHPORTS) return;  // closed already
    std::lock_guard<std::recursive_mutex> lock(Proc().mu);
    if (!memif_server.empty()) {
      ReleaseMemifServer(memif_server, memif_id);
      return;
    }
    ClosePort(port, vdev);
    if (!key.empty()) Proc().devices_in_use.erase(key);
  }
};

struct PortRef {
  uint16_t port = 0;
  uint16_t queue = 0;
  std::shared_ptr<Device> device;
  bool up = false;  // memif: connected
  rte_ether_addr mac{};
  std::unique_ptr<IdLock> id_lock;
  std::unique_ptr<Bell> peer_bell;  // memif: the doorbell of the transport on the other end
  bool ring_pending = false;        // in DpdkTransport::to_ring_
  uint32_t idle_polls = 0;          // consecutive polls that found nothing, up to kIdlePolls
};

class DpdkTransport final : public Transport {
 public:
  DpdkTransport(const TransportOptions& o, uint16_t port, std::unique_ptr<Transport> reservation)
      : options_(o),
        port_(port),
        reservation_(std::move(reservation)),
        doorbells_(o.dpdk.doorbells),
        spin_only_(o.dpdk.spin_only),
        spin_polls_(o.dpdk.spin_polls),
        yield_for_(o.dpdk.yield_for),
        first_nap_(std::max(o.dpdk.first_nap, std::chrono::microseconds(1))),
        max_nap_(std::max(o.dpdk.max_nap, std::chrono::microseconds(1))),
        max_sleep_(std::max(o.dpdk.max_sleep, std::chrono::microseconds(1))) {
    tx_mbufs_.fill(nullptr);
    tx_gen_.fill(0);
    tx_built_burst_.fill(0);
  }

  ~DpdkTransport() override {
    FreeRx();
    for (rte_mbuf*& m : tx_mbufs_) {
      if (m != nullptr) rte_pktmbuf_free(m);
    }
    rte_pktmbuf_free_bulk(tx_stash_.data(), tx_stash_n_);
    ports_.clear();                // the last user of a device closes it
    if (!memif_server_.empty()) {  // kept with the socket for the next switch side (dpdk.cc)
      std::lock_guard<std::recursive_mutex> lock(Proc().mu);
      Proc().memif_servers.at(memif_server_).reservation = std::move(reservation_);
    }
  }

  Status Init(std::vector<PortRef> ports, uint64_t tx_offloads, uint64_t rx_offloads,
              std::string name) {
    ports_ = std::move(ports);
    tx_offloads_ = tx_offloads;
    rx_offloads_ = rx_offloads;
    name_ = std::move(name);
    neighbours_ = StaticNeighbours(options_.dpdk.neighbours);
    local_ip_ = options_.bind_ipv4;
    reply_ip_ = local_ip_ != 0 ? local_ip_ : kLoopbackIpv4;
    return Status();
  }

  Endpoint local_endpoint() const override { return Endpoint{local_ip_, port_}; }
  size_t max_datagram_bytes() const override { return options_.max_datagram_bytes; }

  std::span<uint8_t> TxBuffer(size_t index) override {
    RegisterThread();
    rte_mbuf*& m = tx_mbufs_.at(index);
    if (m != nullptr && rte_mbuf_refcnt_read(m) != 1) {  // still with the driver: take another
      rte_pktmbuf_free(m);
      m = nullptr;
    }
    if (m == nullptr) {
      m = AllocTx();
      if (m == nullptr) {  // pool exhausted: lend plain memory (Send copies it)
        return Transport::TxBuffer(index);
      }
      m->hash.usr = static_cast<uint32_t>(index);  // LentSlot finds the slot from the payload
    }
    return {rte_pktmbuf_mtod_offset(m, uint8_t*, kHeaderBytes), options_.max_datagram_bytes};
  }

  // The peers are rung once the whole batch is out (not after each burst): a receiver woken
  // early would take part of it and sleep again, and on a busy machine the woken one may take
  // the sender's CPU before the sender finishes the batch.
  Result<size_t> Send(std::span<const TxDatagram> batch) override {
    RegisterThread();
    Result<size_t> r = SendBursts(batch);
    for (const uint16_t pi : to_ring_) {
      ports_[pi].ring_pending = false;
      ports_[pi].peer_bell->RingIfSleeping();
    }
    to_ring_.clear();
    return r;
  }

  Result<size_t> SendBursts(std::span<const TxDatagram> batch) {
    ++send_gen_;
    // The lent buffers of this batch and how often each is used: one used once is handed to the
    // driver with its reference (no atomic; its slot gets a fresh mbuf on the next TxBuffer), one
    // used for several destinations keeps the slot's reference while the copies are made.
    if (batch_slots_.size() < batch.size()) batch_slots_.resize(batch.size());
    for (size_t i = 0; i < batch.size(); ++i) {
      const int64_t slot = LentSlot(batch[i].data.data());
      batch_slots_[i] = static_cast<int32_t>(slot);
      if (slot < 0) continue;
      if (tx_gen_[slot] != send_gen_) {
        tx_gen_[slot] = send_gen_;
        tx_uses_[slot] = 0;
      }
      ++tx_uses_[slot];
    }
    size_t taken = 0;
    while (taken < batch.size()) {
      ++burst_gen_;
      const size_t chunk = std::min(batch.size() - taken, kBurst);
      size_t built = 0;     // frames in frames_
      size_t consumed = 0;  // datagrams of the chunk handled (sent, or skipped as unroutable)
      int run_port = -1;    // all frames of one tx_burst go out on one port
      for (; consumed < chunk; ++consumed) {
        const TxDatagram& d = batch[taken + consumed];
        ASSIGN_OR_RETURN(int pi, Route(d.destination));
        if (pi < 0) {  // no way to this destination: counted, skipped
          if (built == 0) {
            counts_.send_errors.Add(1);
            continue;
          }
          break;  // send what is built first, count this one in the next round
        }
        if (run_port >= 0 && pi != run_port) break;
        rte_mbuf* m =
            BuildFrame(d, ports_[pi], batch_slots_[taken + consumed], &frame_slot_[built]);
        if (m == nullptr) break;  // pool exhausted: send what we have
        run_port = pi;
        frames_[built++] = m;
      }
      if (built == 0) {
        if (consumed == 0) {
          counts_.send_buffer_full.Add(1);
          return taken;
        }
        taken += consumed;
        continue;
      }
      PortRef& p = ports_[run_port];
      const uint16_t sent = rte_eth_tx_burst(p.port, p.queue, frames_.data(), built);
      if (sent > 0 && p.peer_bell != nullptr && !p.ring_pending) {
        p.ring_pending = true;
        to_ring_.push_back(static_cast<uint16_t>(run_port));
      }
      counts_.send_calls.Add(1);
      counts_.datagrams_sent.Add(sent);
      for (size_t i = sent; i < built; ++i) {  // not taken: a handed-over buffer goes back
        if (frame_slot_[i] >= 0) {
          LentMbuf(frame_slot_[i]) = frames_[i];
        } else {
          rte_pktmbuf_free(frames_[i]);  // a copy, or a reference of a slot that keeps its own
        }
      }
      if (sent < built) {
        // The ring is full: the caller retries from the first unsent datagram. Every built frame
        // was one datagram (skipped ones come only before the first frame).
        counts_.send_buffer_full.Add(1);
        return taken + (consumed - built) + sent;
      }
      taken += consumed;
    }
    return taken;
  }

  Result<size_t> Receive(std::span<RxDatagram> batch, std::chrono::nanoseconds timeout) override {
    RegisterThread();
    FreeRx();
    if (batch.empty()) return size_t{0};
    // The clock is read only once a poll came back empty with time to wait: a caller that polls
    // (timeout 0, --busy-poll) or finds frames at once never pays for it.
    std::chrono::steady_clock::time_point start{};
    const bool forever = timeout > std::chrono::hours(24);
    uint32_t idle = 0;
    std::chrono::microseconds step = first_nap_;
    while (true) {
      const size_t n = PollOnce(batch);
      if (n > 0) {
        if (yield_for_.count() > 0) last_rx_ = std::chrono::steady_clock::now();
        return n;
      }
      if (timeout <= std::chrono::nanoseconds::zero()) return size_t{0};
      if (woken_.exchange(false, std::memory_order_acq_rel)) return size_t{0};
      const auto now = std::chrono::steady_clock::now();
      if (idle == 0) start = now;
      if (!forever && now - start >= timeout) return size_t{0};
      ++idle;
      if (spin_only_ || idle < spin_polls_) {
        rte_pause();
        continue;
      }
      // Then yield (other processes of a small machine run; alone, this is a spin) for a while
      // after the last datagram, as traffic of a running all-reduce comes back within that.
      if (now - last_rx_ < yield_for_) {
        sched_yield();
        continue;
      }
      // Sleep on the doorbell. Rung by the peers (memif with doorbells): until a frame comes
      // (capped, see Bell). Otherwise naps of `step`, growing to max_nap_ while nothing comes.
      Bell* bell = bell_.load(std::memory_order_relaxed);
      std::chrono::nanoseconds nap = rung_by_peers_ ? max_sleep_ : step;
      if (!forever) nap = std::min<std::chrono::nanoseconds>(nap, timeout - (now - start));
      const uint32_t seen = bell->PrepareSleep();
      if (const size_t got = PollOnce(batch, true);
          got > 0) {  // came before the peers saw the flag
        bell->Awake();
        if (yield_for_.count() > 0) last_rx_ = std::chrono::steady_clock::now();
        return got;
      }
      if (woken_.load(std::memory_order_acquire)) {
        bell->Awake();
        continue;
      }
      bell->Sleep(seen, nap);
      step = std::min<std::chrono::microseconds>(step * 2, max_nap_);
    }
  }

  // Sets woken_ before reading bell_: a Receive that sleeps on a bell this did not ring (the
  // client's switched in Send) sees woken_ first.
  void Wake() override {
    woken_.store(true, std::memory_order_seq_cst);
    bell_.load(std::memory_order_seq_cst)->Ring();
  }

  TransportCounters counters() const override { return counts_.Snapshot(); }

  std::string name() const override { return name_; }

 private:
  static constexpr size_t kBurst = 64;
  static constexpr size_t kRxHeld = 1024;     // received mbufs held until the next Receive
  static constexpr uint32_t kIdlePolls = 16;  // PollOnce: a power of two
  static constexpr size_t kLentSlots = kTxBuffers + kRxHeld;
  static constexpr unsigned kTxStash = 32;

  // A fresh mbuf for transmitting, from a stash filled in bulk (one mempool access per
  // kTxStash mbufs instead of one per packet).
  rte_mbuf* AllocTx() {
    if (tx_stash_n_ == 0) {
      if (rte_pktmbuf_alloc_bulk(Proc().pool, tx_stash_.data(), kTxStash) != 0) {
        return rte_pktmbuf_alloc(Proc().pool);  // nearly exhausted: what is left, one by one
      }
      tx_stash_n_ = kTxStash;
    }
    return tx_stash_[--tx_stash_n_];
  }

  void FreeRx() {
    if (rx_held_ > 0) {
      rte_pktmbuf_free_bulk(rx_mbufs_.data(), rx_held_);
      rx_held_ = 0;
    }
  }

  // The port index for a destination; -1 when there is none. A memif client connects on its
  // first datagram (to the socket of the destination's port).
  Result<int> Route(const Endpoint& dst) {
    if (memif_client_) {
      if (!ports_.empty()) return 0;
      RETURN_IF_ERROR(ConnectClient(dst));
      return 0;
    }
    if (ports_.size() == 1) return 0;
    if (dst == last_route_ep_) return last_route_;
    auto it = routes_.find(dst);
    if (it == routes_.end()) return -1;  // a memif server answers only those it heard from
    last_route_ep_ = dst;
    last_route_ = it->second;
    return it->second;
  }

  Status ConnectClient(const Endpoint& dst);

  // The mbuf whose payload (behind the headers) would be at `payload`, when the mbuf has the
  // layout of the pool's: buffer right behind it, default headroom.
  static uintptr_t MbufBehind(const uint8_t* payload) {
    return reinterpret_cast<uintptr_t>(payload) -
           (kHeaderBytes + RTE_PKTMBUF_HEADROOM + sizeof(rte_mbuf));
  }

  // The lent mbuf of a slot: [0, kTxBuffers) the TxBuffer slots, [kTxBuffers, kLentSlots) the
  // received mbufs lent for replies (RxDatagram::reply_buffer), rx_mbufs_[slot - kTxBuffers].
  rte_mbuf*& LentMbuf(int64_t slot) {
    return slot < static_cast<int64_t>(kTxBuffers) ? tx_mbufs_[slot] : rx_mbufs_[slot - kTxBuffers];
  }

  // The slot whose lent mbuf holds `payload` (the address TxBuffer returned, or a received
  // datagram's reply_buffer), or -1. O(1): the mbuf sits at a fixed offset before its payload, and
  // only an address inside the pool's memory is looked at; the slot index stored in the mbuf
  // (hash.usr, unused on transmit, written when lent) is confirmed by tx_mbufs_ or rx_mbufs_, so
  // memory of another transport or of the caller never matches.
  int64_t LentSlot(const uint8_t* payload) const {
    const uintptr_t a = MbufBehind(payload);
    if (!Proc().InPool(a, sizeof(rte_mbuf))) return -1;
    const auto* m = reinterpret_cast<const rte_mbuf*>(a);
    const uint32_t slot = m->hash.usr;
    const bool lent = slot < kTxBuffers
                          ? tx_mbufs_[slot] == m
                          : slot - kTxBuffers < rx_held_ && rx_mbufs_[slot - kTxBuffers] == m;
    if (!lent || rte_pktmbuf_mtod_offset(m, const uint8_t*, kHeaderBytes) != payload) return -1;
    return slot;
  }

  // A frame for d, whose buffer is lent slot `slot` (or -1). *handed_over: the slot whose mbuf
  // the frame is (its reference now the frame's), else -1.
  rte_mbuf* BuildFrame(const TxDatagram& d, const PortRef& p, int32_t slot, int32_t* handed_over) {
    const size_t len = d.data.size();
    rte_mbuf* m = nullptr;
    *handed_over = -1;
    // In place: while no driver still holds the slot's mbuf and it is not in the burst being
    // built already. A driver that copies the frame in its tx_burst (memif) has let go of it by
    // the next burst, so every destination of a multicast (one memif port each, so one burst
    // each) is built in place; a NIC holds it until sent, so its other destinations are copies.
    // The last use hands the slot's reference over.
    if (slot >= 0 && tx_built_burst_[slot] != burst_gen_ && LentMbuf(slot) != nullptr &&
        rte_mbuf_refcnt_read(LentMbuf(slot)) == 1) {
      tx_built_burst_[slot] = burst_gen_;
      m = LentMbuf(slot);
      if (tx_uses_[slot] <= 1) {
        // The driver frees it; TxBuffer(slot) takes a fresh one (a received mbuf: FreeRx skips it).
        LentMbuf(slot) = nullptr;
        *handed_over = slot;
      } else {
        rte_mbuf_refcnt_update(m, 1);  // the driver's reference; the slot keeps its own
      }
      if (tx_uses_[slot] > 0) --tx_uses_[slot];
    } else {
      m = AllocTx();
      if (m == nullptr) return nullptr;
      if (len > kMaxPayload) {
        rte_pktmbuf_free(m);
        return nullptr;
      }
      std::memcpy(rte_pktmbuf_mtod_offset(m, uint8_t*, kHeaderBytes), d.data.data(), len);
      if (slot >= 0 && tx_uses_[slot] > 0) --tx_uses_[slot];
    }
    m->data_len = static_cast<uint16_t>(kHeaderBytes + len);
    m->pkt_len = m->data_len;
    auto* eth = rte_pktmbuf_mtod(m, rte_ether_hdr*);
    auto* ip = reinterpret_cast<rte_ipv4_hdr*>(eth + 1);
    auto* udp = reinterpret_cast<rte_udp_hdr*>(ip + 1);
    eth->src_addr = p.mac;
    eth->ether_type = rte_cpu_to_be_16(RTE_ETHER_TYPE_IPV4);
    if (d.destination.ipv4 != last_dst_ip_ || last_dst_mac_ == nullptr) {
      // Entries are never erased and map nodes never move: the pointer stays valid, and sees
      // a MAC learned again later.
      auto n = neighbours_.find(d.destination.ipv4);
      last_dst_ip_ = d.destination.ipv4;
      last_dst_mac_ = n == neighbours_.end() ? nullptr : &n->second;
    }
    if (last_dst_mac_ != nullptr) {
      eth->dst_addr = *last_dst_mac_;
    } else {
      memset(&eth->dst_addr, 0xff, sizeof(eth->dst_addr));
    }
    ip->version_ihl = RTE_IPV4_VHL_DEF;
    ip->type_of_service = 0;
    ip->total_length = rte_cpu_to_be_16(static_cast<uint16_t>(20 + 8 + len));
    ip->packet_id = 0;
    ip->fragment_offset = rte_cpu_to_be_16(RTE_IPV4_HDR_DF_FLAG);
    ip->time_to_live = 64;
    ip->next_proto_id = IPPROTO_UDP;
    ip->hdr_checksum = 0;
    ip->src_addr = rte_cpu_to_be_32(reply_ip_);
    ip->dst_addr = rte_cpu_to_be_32(d.destination.ipv4);
    udp->src_port = rte_cpu_to_be_16(port_);
    udp->dst_port = rte_cpu_to_be_16(d.destination.port);
    udp->dgram_len = rte_cpu_to_be_16(static_cast<uint16_t>(8 + len));
    udp->dgram_cksum = 0;
    if (tx_offloads_ != 0) {
      m->l2_len = sizeof(rte_ether_hdr);
      m->l3_len = sizeof(rte_ipv4_hdr);
      m->ol_flags = RTE_MBUF_F_TX_IPV4 | RTE_MBUF_F_TX_IP_CKSUM | RTE_MBUF_F_TX_UDP_CKSUM;
      udp->dgram_cksum = rte_ipv4_phdr_cksum(ip, m->ol_flags);
    } else {
      m->ol_flags = 0;
      ip->hdr_checksum = Ipv4HeaderChecksum(ip);
      if (udp_checksum_) {  // over memif: 0 (no checksum), as the kernel leaves it on loopback
        uint16_t c = rte_ipv4_udptcp_cksum(ip, udp);
        udp->dgram_cksum = c == 0 ? 0xffff : c;
      }
    }
    return m;
  }

  // Answers an ARP request for our address on port p.
  void AnswerArp(rte_mbuf* in, const PortRef& p) {
    if (in->data_len < sizeof(rte_ether_hdr) + sizeof(rte_arp_hdr)) return;
    const auto* eth = rte_pktmbuf_mtod(in, const rte_ether_hdr*);
    const auto* arp = reinterpret_cast<const rte_arp_hdr*>(eth + 1);
    if (arp->arp_opcode != rte_cpu_to_be_16(RTE_ARP_OP_REQUEST)) return;
    const uint32_t sender = rte_be_to_cpu_32(arp->arp_data.arp_sip);
    neighbours_[sender] = arp->arp_data.arp_sha;
    const uint32_t target = rte_be_to_cpu_32(arp->arp_data.arp_tip);
    if (target != reply_ip_ && target != local_ip_) return;
    rte_mbuf* m = rte_pktmbuf_alloc(Proc().pool);
    if (m == nullptr) return;
    auto* oeth = rte_pktmbuf_mtod(m, rte_ether_hdr*);
    auto* oarp = reinterpret_cast<rte_arp_hdr*>(oeth + 1);
    oeth->dst_addr = eth->src_addr;
    oeth->src_addr = p.mac;
    oeth->ether_type = rte_cpu_to_be_16(RTE_ETHER_TYPE_ARP);
    *oarp = *arp;
    oarp->arp_opcode = rte_cpu_to_be_16(RTE_ARP_OP_REPLY);
    oarp->arp_data.arp_tha = arp->arp_data.arp_sha;
    oarp->arp_data.arp_tip = arp->arp_data.arp_sip;
    oarp->arp_data.arp_sha = p.mac;
    oarp->arp_data.arp_sip = rte_cpu_to_be_32(target);
    m->data_len = m->pkt_len = sizeof(rte_ether_hdr) + sizeof(rte_arp_hdr);
    if (rte_eth_tx_burst(p.port, p.queue, &m, 1) != 1) rte_pktmbuf_free(m);
  }

  // One pass over the ports: fills batch with the datagrams for us. A port that has been idle
  // for kIdlePolls polls (a memif server's interfaces without a worker) is polled only every
  // kIdlePolls-th pass, unless `all` (the last poll before a sleep, which must see every frame).
  size_t PollOnce(std::span<RxDatagram> batch, bool all = false) {
    size_t n = 0;
    const size_t nports = ports_.size();
    const bool poll_idle = all || (++poll_pass_ & (kIdlePolls - 1)) == 0;
    size_t pi = rx_next_port_;
    for (size_t k = 0; k < nports && n < batch.size(); ++k, pi = pi + 1 == nports ? 0 : pi + 1) {
      PortRef& p = ports_[pi];
      if (p.idle_polls >= kIdlePolls && !poll_idle) continue;
      const uint16_t want =
          static_cast<uint16_t>(std::min({batch.size() - n, kBurst, rx_mbufs_.size() - rx_held_}));
      if (want == 0) break;
      rte_mbuf** into = rx_mbufs_.data() + rx_held_;
      const uint16_t got = rte_eth_rx_burst(p.port, p.queue, into, want);
      if (got == 0) {
        if (p.idle_polls < kIdlePolls) ++p.idle_polls;
        continue;
      }
      p.idle_polls = 0;
      counts_.receive_calls.Add(1);
      for (uint16_t i = 0; i < got; ++i) {
        rte_mbuf* m = into[i];
        if (i + 1 < got) rte_prefetch0(rte_pktmbuf_mtod(into[i + 1], void*));
        if (Parse(m, p, static_cast<int>(pi), &batch[n])) {
          if (!batch[n].reply_buffer.empty()) {
            m->hash.usr = static_cast<uint32_t>(kTxBuffers + rx_held_);  // for LentSlot
          }
          ++n;
          rx_mbufs_[rx_held_++] = m;
        } else {
          rte_pktmbuf_free(m);
        }
      }
    }
    rx_next_port_ = rx_next_port_ + 1 >= nports ? 0 : rx_next_port_ + 1;
    if (n > 0) counts_.datagrams_received.Add(n);
    return n;
  }

  // True when m is a UDP datagram for us; fills d with a view of its payload. The frame codec is
  // the raw transports' one (frame.h); checksums the device verified are not verified again.
  bool Parse(rte_mbuf* m, PortRef& p, int port_index, RxDatagram* d) {
    const uint64_t l3 = m->ol_flags & RTE_MBUF_F_RX_IP_CKSUM_MASK;
    const uint64_t l4 = m->ol_flags & RTE_MBUF_F_RX_L4_CKSUM_MASK;
    const ParsedFrame f =
        ParseFrame({rte_pktmbuf_mtod(m, const uint8_t*), m->data_len}, m->pkt_len,
                   FrameFilter{local_ip_, port_, l3 != RTE_MBUF_F_RX_IP_CKSUM_GOOD,
                               l4 != RTE_MBUF_F_RX_L4_CKSUM_GOOD});
    if (f.verdict == FrameVerdict::kArp) {
      AnswerArp(m, p);
      return false;
    }
    if (f.verdict != FrameVerdict::kUdp) return false;
    if (l3 == RTE_MBUF_F_RX_IP_CKSUM_BAD || l4 == RTE_MBUF_F_RX_L4_CKSUM_BAD) return false;
    const uint32_t src_ip = f.source.ipv4;
    const uint32_t dst_ip = f.destination_ipv4;
    d->source = f.source;
    const uint8_t* payload = f.payload.data();
    const bool whole = m->nb_segs == 1 && f.whole;
    d->truncated = !whole || f.payload_bytes > options_.max_datagram_bytes;
    d->data = {payload, std::min(f.payload.size(), options_.max_datagram_bytes)};
    if (d->truncated) counts_.truncated.Add(1);
    // Lent for a reply built over it when Send can hand this mbuf to the driver as it would a
    // TxBuffer's: one segment of our own, not shared, at the pool's layout (LentSlot finds it).
    d->reply_buffer = {};
    if (!d->truncated && m->nb_segs == 1 && RTE_MBUF_DIRECT(m) && rte_mbuf_refcnt_read(m) == 1 &&
        MbufBehind(payload) == reinterpret_cast<uintptr_t>(m) &&
        payload + options_.max_datagram_bytes <=
            static_cast<const uint8_t*>(m->buf_addr) + m->buf_len) {
      d->reply_buffer = {const_cast<uint8_t*>(payload), options_.max_datagram_bytes};
    }
    // Learn the way back: the sender's MAC, and (several ports) its port.
    rte_ether_addr src_mac;
    std::memcpy(src_mac.addr_bytes, f.source_mac.data(), RTE_ETHER_ADDR_LEN);
    if (src_ip != last_src_ip_ || !rte_is_same_ether_addr(&src_mac, &last_src_mac_)) {
      last_src_ip_ = src_ip;
      last_src_mac_ = src_mac;
      neighbours_[src_ip] = src_mac;
    }
    if (ports_.size() > 1 && !(d->source == last_route_ep_ && last_route_ == port_index)) {
      routes_[d->source] = port_index;
      last_route_ep_ = d->source;
      last_route_ = port_index;
    }
    if (local_ip_ == 0) reply_ip_ = dst_ip;  // answer from the address we were sent to
    return true;
  }

 public:
  bool doorbells() const { return doorbells_; }
  // The doorbell the peers ring (the owner's thread, or before the transport is used).
  void UseSharedBell(std::unique_ptr<Bell> bell) {
    shared_bell_ = std::move(bell);
    bell_.store(shared_bell_.get(), std::memory_order_seq_cst);
    rung_by_peers_ = true;
  }

  bool memif_client_ = false;
  std::string memif_server_;  // a memif server's socket name, in Process::memif_servers
  bool udp_checksum_ = true;  // computed in software when not offloaded (not over memif)
  std::string memif_prefix_;
  uint32_t memif_max_ids_ = 64;

 private:
  TransportOptions options_;
  uint16_t port_;
  std::unique_ptr<Transport> reservation_;  // the kernel UDP port kept so no one else takes it
  std::vector<PortRef> ports_;
  uint64_t tx_offloads_ = 0, rx_offloads_ = 0;
  std::string name_;
  uint32_t local_ip_ = 0, reply_ip_ = 0;
  // The doorbell Receive sleeps on and Wake() rings: own_bell_ (private memory) until a memif
  // transport has the one its peers ring (a server from the start, a client once connected).
  Bell own_bell_;
  std::unique_ptr<Bell> shared_bell_;
  std::atomic<Bell*> bell_{&own_bell_};
  bool doorbells_ = true;  // memif: ring the peers and sleep until rung (DpdkOptions::doorbells)
  bool rung_by_peers_ = false;  // bell_ is shared_bell_
  bool spin_only_ = false;
  std::chrono::steady_clock::time_point last_rx_{};
  // Waiting, from DpdkOptions (options.h: each field's SWITCHML_DPDK_* variable).
  uint32_t spin_polls_ = 0;
  std::chrono::microseconds yield_for_{0};
  std::chrono::microseconds first_nap_{20};
  std::chrono::microseconds max_nap_{1000};
  std::chrono::microseconds max_sleep_{10000};
  std::atomic<bool> woken_{false};
  // Receive side.
  std::array<rte_mbuf*, kRxHeld> rx_mbufs_{};  // null: handed to the driver as a reply
  size_t rx_held_ = 0;
  size_t rx_next_port_ = 0;
  uint32_t poll_pass_ = 0;  // PollOnce's passes (its idle ports are polled every kIdlePolls-th)
  // Transmit side: the lent mbufs by slot, how often the current Send uses each, and the burst
  // that last built a frame in place in it (a second destination in the same burst is a copy).
  std::array<rte_mbuf*, kTxBuffers> tx_mbufs_;
  // By slot (LentMbuf): the Send whose uses tx_uses_ counts, the datagrams of that Send yet to
  // use the slot, the burst that built a frame in place in it.
  std::array<uint64_t, kLentSlots> tx_gen_;
  std::array<uint32_t, kLentSlots> tx_uses_{};
  std::array<uint64_t, kLentSlots> tx_built_burst_;
  uint64_t send_gen_ = 0;
  uint64_t burst_gen_ = 0;
  std::vector<int32_t> batch_slots_;          // Send: each datagram's lent slot, or -1
  std::array<int32_t, kBurst> frame_slot_{};  // Send: the slot a frame was handed over from
  std::array<rte_mbuf*, kBurst> frames_{};
  std::array<rte_mbuf*, kTxStash> tx_stash_{};  // AllocTx: fresh mbufs, the first tx_stash_n_
  unsigned tx_stash_n_ = 0;
  std::vector<uint16_t> to_ring_;  // Send: the ports whose peers to ring at its end
  // Neighbours and (memif server) the port each source came in on.
  std::unordered_map<uint32_t, rte_ether_addr> neighbours_;
  uint32_t last_dst_ip_ = 0;  // BuildFrame's cache of neighbours_
  const rte_ether_addr* last_dst_mac_ = nullptr;
  uint32_t last_src_ip_ = 0;
  rte_ether_addr last_src_mac_{};
  std::unordered_map<Endpoint, int> routes_;
  Endpoint last_route_ep_{};
  int last_route_ = -1;
  // Added to by the transport's one thread only, read by any.
  SingleWriterTransportCounters counts_;
};

std::string NoServerHint(uint16_t port) {
  return ": is a switch with --transport dpdk serving data port " + std::to_string(port) +
         " on this host (in this network namespace), with enough memif interfaces "
         "(SWITCHML_DPDK_MEMIF_INTERFACES)?";
}

Status DpdkTransport::ConnectClient(const Endpoint& dst) {
  const std::string sock = memif_prefix_ + "-" + std::to_string(dst.port);
  const std::string what = "dpdk memif client of " + sock;
  ASSIGN_OR_RETURN(std::unique_ptr<IdLock> id,
                   TakeId(options_.dpdk.lock_dir, sock, memif_max_ids_));
  PortRef p;
  std::unique_ptr<Bell> own;
  if (doorbells_) {
    ASSIGN_OR_RETURN(p.peer_bell, Bell::Map(options_.dpdk.lock_dir, BellName(sock)));
    ASSIGN_OR_RETURN(own, Bell::Map(id->fd, id->path, /*own_fd=*/false));
  }
  {
    std::lock_guard<std::recursive_mutex> lock(Proc().mu);
    const std::string vdev =
        "net_memif_c" + std::to_string(getpid()) + "_" + std::to_string(Proc().next_vdev++);
    ASSIGN_OR_RETURN(p.port,
                     MakeVdev(vdev,
                              "role=client,id=" + std::to_string(id->id) + ",socket=" + sock +
                                  ",socket-abstract=yes" + std::string(kMemifBufferArg),
                              what));
    uint64_t tx_off = 0, rx_off = 0;
    if (Status st = StartPort(p.port, 1, what, &tx_off, &rx_off); !st.ok()) {
      ClosePort(p.port, vdev);  // memif's client connects when it starts: most likely no server
      return UnavailableError(st.message() + NoServerHint(dst.port));
    }
    rte_eth_macaddr_get(p.port, &p.mac);
    p.device = std::make_shared<Device>();
    p.device->port = p.port;
    p.device->vdev = vdev;
  }
  if (Status st = WaitLinkUp(p.port, what + " (id " + std::to_string(id->id) + ")", kLinkTimeout);
      !st.ok()) {
    return UnavailableError(st.message() + NoServerHint(dst.port));
  }
  // A memif client grants the server its receive ring's buffers when it polls: poll once now, so
  // the switch can answer before our first Receive.
  std::array<rte_mbuf*, 32> early;
  const uint16_t got = rte_eth_rx_burst(p.port, 0, early.data(), early.size());
  rte_pktmbuf_free_bulk(early.data(), got);
  p.up = true;
  p.id_lock = std::move(id);
  if (own != nullptr) UseSharedBell(std::move(own));
  LOG(kInfo, kTransport) << what << " connected as id " << p.id_lock->id;
  ports_.push_back(std::move(p));
  return Status();
}

// ---------------------------------------------------------------------------------------------
// Opening: OpenDpdkConsecutive's steps. EAL and the process-wide state come from the section
// above (InitEal, Proc()); these set up the ports and queues of one open's transports.

using Transports = std::vector<std::unique_ptr<Transport>>;

// The options' checks that need no EAL.
Status CheckOpenOptions(const TransportOptions& options, size_t count) {
  if (count == 0) return InvalidArgumentError("OpenDpdkConsecutive: count must be at least 1");
  if (options.max_datagram_bytes > kMaxPayload || options.max_datagram_bytes == 0) {
    return InvalidArgumentError("dpdk transport: max datagram bytes must be in 1.." +
                                std::to_string(kMaxPayload));
  }
  const uint32_t interfaces = options.dpdk.memif_interfaces;
  if (interfaces < 1 || interfaces > 256) {
    return InvalidArgumentError("dpdk transport: memif_interfaces must be in 1..256, not " +
                                std::to_string(interfaces));
  }
  return Status();
}

// memif: `count` consecutive UDP ports reserved in the kernel (free, unique on this host); a
// switch side takes free memif sockets of an earlier open first.
Result<Transports> ReserveMemifPorts(const TransportOptions& options, const std::string& prefix,
                                     size_t count) {
  TransportOptions u;
  u.bind_ipv4 = 0;
  u.port = options.port;
  u.udp.gso = u.udp.gro = false;
  u.udp.socket_buffer_bytes = 1;
  u.max_batch = 1;
  Transports kept;
  if (options.switch_side) {
    std::lock_guard<std::recursive_mutex> lock(Proc().mu);
    kept = TakeFreeMemifSockets(prefix, options.port, count);
  }
  auto reserved = kept.empty() ? OpenUdpConsecutive(u, count) : Result<Transports>(std::move(kept));
  if (!reserved.ok()) {
    return Status(reserved.status().code(),
                  "dpdk (memif): reserving ports: " + reserved.status().message());
  }
  return reserved;
}

// A memif server transport on UDP port `port`: its socket's devices, one per interface id, into
// `ports` (on failure, the devices taken so far go back with `ports`), and the doorbells.
Status AttachMemifServer(const TransportOptions& options, const std::string& prefix, uint16_t port,
                         DpdkTransport* tr, std::vector<PortRef>* ports, std::string* name) {
  const uint32_t interfaces = options.dpdk.memif_interfaces;
  const std::string sock = prefix + "-" + std::to_string(port);
  // The doorbells: ours, and the one of the client of each id (its id lock's file).
  std::vector<std::unique_ptr<Bell>> peer_bells;
  if (tr->doorbells()) {
    ASSIGN_OR_RETURN(std::unique_ptr<Bell> own, Bell::Map(options.dpdk.lock_dir, BellName(sock)));
    tr->UseSharedBell(std::move(own));
    for (uint32_t id = 0; id < interfaces; ++id) {
      ASSIGN_OR_RETURN(std::unique_ptr<Bell> b,
                       Bell::Map(options.dpdk.lock_dir, IdLockName(sock, id)));
      peer_bells.push_back(std::move(b));
    }
  }
  std::lock_guard<std::recursive_mutex> lock(Proc().mu);
  Process::MemifServer& server = Proc().memif_servers[sock];
  server.prefix = prefix;
  server.udp_port = port;
  tr->memif_server_ = sock;
  for (uint32_t id = 0; id < interfaces; ++id) {
    PortRef p;
    const std::string what = "dpdk memif server " + sock + " id " + std::to_string(id);
    ASSIGN_OR_RETURN(p.port,
                     TakeMemifServer(sock, id,
                                     "role=server,id=" + std::to_string(id) + ",socket=" + sock +
                                         ",socket-abstract=yes" + std::string(kMemifBufferArg),
                                     what));
    rte_eth_macaddr_get(p.port, &p.mac);
    p.device = std::make_shared<Device>();
    p.device->port = p.port;
    p.device->memif_server = sock;
    p.device->memif_id = id;
    if (!peer_bells.empty()) p.peer_bell = std::move(peer_bells[id]);
    ports->push_back(std::move(p));
  }
  *name = "dpdk (memif server " + sock + ", " + std::to_string(interfaces) + " interfaces)";
  return Status();
}

// Device "memif" (the default): a transport per reserved UDP port; a switch side serves memif
// sockets, a worker side connects to them later (ConnectClient).
Result<Transports> OpenMemif(const TransportOptions& options, size_t count) {
  const std::string prefix =
      options.dpdk.memif_socket.empty() ? "switchml-memif" : options.dpdk.memif_socket;
  ASSIGN_OR_RETURN(Transports reserved, ReserveMemifPorts(options, prefix, count));
  Transports out;
  for (size_t t = 0; t < count; ++t) {
    const uint16_t port = reserved[t]->local_endpoint().port;
    auto tr = std::make_unique<DpdkTransport>(options, port, std::move(reserved[t]));
    tr->memif_prefix_ = prefix;
    tr->memif_max_ids_ = 256;
    tr->udp_checksum_ = false;
    std::vector<PortRef> ports;
    std::string name;
    if (options.switch_side) {
      RETURN_IF_ERROR(AttachMemifServer(options, prefix, port, tr.get(), &ports, &name));
    } else {
      tr->memif_client_ = true;
      name = "dpdk (memif client)";
    }
    RETURN_IF_ERROR(tr->Init(std::move(ports), 0, 0, std::move(name)));
    out.push_back(std::move(tr));
  }
  return out;
}

// The port of `device`: a virtual device ("net_...[,args]") made now (its name in `vdev`), or a
// port EAL found by that name. Under Proc().mu.
Result<uint16_t> FindDevicePort(const std::string& device, const std::string& what,
                                std::string* vdev) {
  uint16_t port = 0;
  if (device.rfind("net_", 0) == 0) {
    const size_t comma = device.find(',');
    *vdev = device.substr(0, comma);
    return MakeVdev(*vdev, comma == std::string::npos ? "" : device.substr(comma + 1), what);
  }
  if (rte_eth_dev_get_port_by_name(device.c_str(), &port) == 0) return port;
  std::string ports;
  uint16_t pid;
  RTE_ETH_FOREACH_DEV(pid) {
    char name[RTE_ETH_NAME_MAX_LEN];
    if (rte_eth_dev_get_name_by_port(pid, name) == 0) ports += std::string(" ") + name;
  }
  return NotFoundError(
      what + ": no such port (ports EAL found:" + (ports.empty() ? std::string(" none") : ports) +
      "); a PCI device must be bound to vfio-pci and EAL started without "
      "--no-pci (SWITCHML_DPDK_EAL / --dpdk-eal)");
}

// Steers UDP port base + t to queue t, for t in 0..count-1.
Status SteerQueues(uint16_t port, uint16_t base, size_t count, const std::string& what) {
  for (size_t t = 0; t < count; ++t) {
    rte_flow_attr attr{};
    attr.ingress = 1;
    rte_flow_item_udp udp_spec{}, udp_mask{};
    udp_spec.hdr.dst_port = rte_cpu_to_be_16(static_cast<uint16_t>(base + t));
    udp_mask.hdr.dst_port = 0xffff;
    rte_flow_item pattern[] = {
        {RTE_FLOW_ITEM_TYPE_ETH, nullptr, nullptr, nullptr},
        {RTE_FLOW_ITEM_TYPE_IPV4, nullptr, nullptr, nullptr},
        {RTE_FLOW_ITEM_TYPE_UDP, &udp_spec, nullptr, &udp_mask},
        {RTE_FLOW_ITEM_TYPE_END, nullptr, nullptr, nullptr},
    };
    rte_flow_action_queue queue{static_cast<uint16_t>(t)};
    rte_flow_action actions[] = {{RTE_FLOW_ACTION_TYPE_QUEUE, &queue},
                                 {RTE_FLOW_ACTION_TYPE_END, nullptr}};
    rte_flow_error err{};
    if (rte_flow_create(port, &attr, pattern, actions, &err) == nullptr) {
      return FailedPreconditionError(what + " cannot steer UDP port " + std::to_string(base + t) +
                                     " to queue " + std::to_string(t) +
                                     " (rte_flow: " + (err.message ? err.message : "no message") +
                                     "): use one thread (--threads 1)");
    }
  }
  return Status();
}

// Starts `port` with `count` queues, waits for its link and steers each transport's UDP port
// (from `*base`; 0: a random one, chosen here) to its queue. The caller closes the port if this
// fails.
Status StartDevicePort(uint16_t port, size_t count, const std::string& what, uint16_t* base,
                       uint64_t* tx_off, uint64_t* rx_off) {
  RETURN_IF_ERROR(StartPort(port, static_cast<uint16_t>(count), what, tx_off, rx_off));
  RETURN_IF_ERROR(WaitLinkUp(port, what, std::chrono::seconds(5)));
  if (*base == 0) *base = static_cast<uint16_t>(20000 + std::random_device{}() % 12000);
  if (uint32_t{*base} + count - 1 > 65535) {
    return InvalidArgumentError(what + ": ports pass 65535: choose a lower base port");
  }
  if (count > 1) RETURN_IF_ERROR(SteerQueues(port, *base, count, what));
  return Status();
}

// A device (a PCI port or a virtual device): one port for this process's transports, queue t
// for transport t.
Result<Transports> OpenDevice(const TransportOptions& options, const std::string& device,
                              size_t count) {
  if (options.bind_ipv4 == 0) {
    return InvalidArgumentError("dpdk transport on device '" + device +
                                "' needs this host's IPv4 address on it: set the bind address "
                                "(--bind / Config::bind_address)");
  }
  std::lock_guard<std::recursive_mutex> lock(Proc().mu);
  if (Proc().devices_in_use.count(device) != 0) {
    return FailedPreconditionError("dpdk device '" + device +
                                   "' is already used by this process (open it once, with one "
                                   "transport per thread)");
  }
  std::string vdev;
  const std::string what = "dpdk device " + device;
  ASSIGN_OR_RETURN(const uint16_t port, FindDevicePort(device, what, &vdev));
  uint16_t base = options.port;
  uint64_t tx_off = 0, rx_off = 0;
  if (Status st = StartDevicePort(port, count, what, &base, &tx_off, &rx_off); !st.ok()) {
    ClosePort(port, vdev);  // the cleanup on failure: nothing else holds the port yet
    return st;
  }
  Proc().devices_in_use[device] = port;
  auto dev = std::make_shared<Device>();
  dev->port = port;
  dev->vdev = vdev;
  dev->key = device;
  rte_ether_addr mac;
  rte_eth_macaddr_get(port, &mac);
  Transports out;
  for (size_t t = 0; t < count; ++t) {
    auto tr = std::make_unique<DpdkTransport>(options, static_cast<uint16_t>(base + t), nullptr);
    PortRef p;
    p.port = port;
    p.queue = static_cast<uint16_t>(t);
    p.mac = mac;
    p.up = true;
    p.device = dev;
    std::vector<PortRef> ports;
    ports.push_back(std::move(p));
    RETURN_IF_ERROR(tr->Init(
        std::move(ports), tx_off, rx_off,
        "dpdk (" + device + " queue " + std::to_string(t) + ", " + MacToString(mac) + ")"));
    out.push_back(std::move(tr));
  }
  return out;
}

}  // namespace

bool DpdkAvailable() { return true; }

Result<std::vector<std::unique_ptr<Transport>>> OpenDpdkConsecutive(const TransportOptions& options,
                                                                    size_t count) {
  RETURN_IF_ERROR(CheckOpenOptions(options, count));
  RETURN_IF_ERROR(InitEal(options.dpdk.eal_args));
  RegisterThread();
  const std::string device = options.dpdk.device.empty() ? "memif" : options.dpdk.device;
  if (device == "memif") return OpenMemif(options, count);
  return OpenDevice(options, device, count);
}

}  // namespace switchml::transport

#endif  // SWITCHML_HAVE_DPDK
