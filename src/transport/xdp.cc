#include "transport/xdp.h"

#ifndef SWITCHML_HAVE_XDP

namespace switchml::transport {

bool XdpAvailable() { return false; }

Result<std::vector<std::unique_ptr<Transport>>> OpenXdpConsecutive(const TransportOptions&,
                                                                   size_t) {
  return UnimplementedError(
      "transport 'xdp' (AF_XDP) is not compiled into this build: libxdp-dev and libbpf-dev (and "
      "clang for the XDP program) were not found when it was configured; install them "
      "(scripts/setup.sh) and configure again");
}

}  // namespace switchml::transport

#else  // SWITCHML_HAVE_XDP

#include <arpa/inet.h>
#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <linux/if_link.h>
#include <linux/if_packet.h>
#include <net/if.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xdp/xsk.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include "base/check.h"
#include "base/logging.h"
#include "base/status_macros.h"
#include "transport/frame.h"
#include "transport/private_dir.h"
#include "transport/xdp_frames.h"

// The XDP program's object file, embedded at build time (embed_file.cmake).
extern const unsigned char switchml_xdp_steer_bpf[];
extern const unsigned long switchml_xdp_steer_bpf_size;

namespace switchml::transport {
namespace {

using Mac = std::array<uint8_t, 6>;
using Clock = std::chrono::steady_clock;

// UMEM layout: kRxFrames frames for the fill ring, then one partition of kTxFrames transmit
// frames per socket (at most kMaxSockets sockets per interface queue and process).
constexpr uint32_t kFrameSize = 2048;
constexpr uint32_t kRxFrames = xdp::kRxFrames;
constexpr uint32_t kTxFrames = 1536;  // Transport::kTxBuffers lent, the rest in flight
constexpr uint32_t kMaxSockets = 8;
constexpr uint32_t kNumFrames = kRxFrames + kMaxSockets * kTxFrames;
// Room for every receive frame twice: the kernel publishes its consumer index of the fill ring
// after the received descriptors, so a frame given back can still count as in the ring
// (xdp_frames.h).
constexpr uint32_t kFillRing = xdp::kFillRingEntries;
// Room for every transmit frame: the kernel never holds back a send for want of a completion.
constexpr uint32_t kCompRing = 16384;
static_assert(kCompRing >= kMaxSockets * kTxFrames);
constexpr uint32_t kRxRing = 2048;
constexpr uint32_t kTxRing = 2048;
// Headers: Ethernet (14), IPv4 without options (20), UDP (8).
constexpr size_t kHeaderBytes = 42;
// A transmit frame's packet starts at kTxPacketOffset, so that the payload is 64-byte aligned.
constexpr size_t kTxPayloadOffset = 64;
constexpr size_t kTxPacketOffset = kTxPayloadOffset - kHeaderBytes;
constexpr size_t kTxPayloadCapacity = kFrameSize - kTxPayloadOffset;
// Received packets start after the kernel's XDP headroom (256 bytes).
constexpr size_t kRxPayloadCapacity = kFrameSize - 256 - kHeaderBytes;
static_assert(kRxPayloadCapacity == kXdpMaxDatagramBytes);
constexpr size_t kMaxPerSend = 256;

std::string ErrnoText(int err) { return std::string(std::strerror(err)); }

bool ParseMac(const std::string& text, Mac* out) {
  unsigned v[6];
  if (std::sscanf(text.c_str(), "%x:%x:%x:%x:%x:%x", &v[0], &v[1], &v[2], &v[3], &v[4], &v[5]) !=
      6) {
    return false;
  }
  for (int i = 0; i < 6; ++i) (*out)[i] = static_cast<uint8_t>(v[i]);
  return true;
}

// What a permission error means here.
std::string PermissionHint(int err) {
  if (err == EPERM || err == EACCES) {
    return " (AF_XDP needs CAP_NET_ADMIN, CAP_NET_RAW and CAP_BPF, and locked memory: run as root "
           "or grant them, e.g. setcap cap_net_admin,cap_net_raw,cap_bpf,cap_ipc_lock+ep)";
  }
  return "";
}

// ---------------------------------------------------------------------------------------------
// Interfaces, routes and neighbours.

struct LocalAddress {
  std::string interface;
  uint32_t ipv4 = 0;  // host order
  uint32_t mask = 0;  // host order
};

struct Interfaces {
  std::vector<LocalAddress> addresses;    // every IPv4 address of this host (namespace)
  std::map<std::string, Mac> macs;        // interface -> MAC
  std::map<std::string, unsigned> flags;  // interface -> IFF_*
};

Result<Interfaces> ListInterfaces() {
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return InternalError("getifaddrs failed: " + ErrnoText(errno));
  Interfaces out;
  for (ifaddrs* a = list; a != nullptr; a = a->ifa_next) {
    if (a->ifa_addr == nullptr) continue;
    out.flags[a->ifa_name] = a->ifa_flags;
    if (a->ifa_addr->sa_family == AF_INET) {
      LocalAddress l;
      l.interface = a->ifa_name;
      l.ipv4 = ntohl(reinterpret_cast<const sockaddr_in*>(a->ifa_addr)->sin_addr.s_addr);
      if (a->ifa_netmask != nullptr) {
        l.mask = ntohl(reinterpret_cast<const sockaddr_in*>(a->ifa_netmask)->sin_addr.s_addr);
      }
      out.addresses.push_back(l);
    } else if (a->ifa_addr->sa_family == AF_PACKET) {
      const auto* ll = reinterpret_cast<const sockaddr_ll*>(a->ifa_addr);
      Mac m{};
      if (ll->sll_halen == 6) std::memcpy(m.data(), ll->sll_addr, 6);
      out.macs[a->ifa_name] = m;
    }
  }
  ::freeifaddrs(list);
  return out;
}

// The interface to use and our address on it: `forced` (XdpOptions::interface) when not empty.
Result<LocalAddress> ChooseInterface(const Interfaces& ifs, uint32_t bind_ipv4,
                                     const std::string& forced) {
  if (!forced.empty()) {
    if (ifs.flags.count(forced) == 0) {
      return NotFoundError(std::string("AF_XDP: SWITCHML_XDP_IFACE names interface '") + forced +
                           "', which does not exist here");
    }
    for (const LocalAddress& a : ifs.addresses) {
      if (a.interface == forced && (bind_ipv4 == 0 || a.ipv4 == bind_ipv4)) return a;
    }
    return InvalidArgumentError(std::string("AF_XDP: interface '") + forced +
                                "' has no IPv4 address" +
                                (bind_ipv4 != 0 ? " " + Ipv4ToString(bind_ipv4) : std::string()));
  }
  if (bind_ipv4 != 0) {
    for (const LocalAddress& a : ifs.addresses) {
      if (a.ipv4 == bind_ipv4) return a;
    }
    return InvalidArgumentError("AF_XDP: " + Ipv4ToString(bind_ipv4) +
                                " is not an address of any interface of this host: bind to the "
                                "address of the interface AF_XDP should use");
  }
  std::vector<LocalAddress> candidates;
  for (const LocalAddress& a : ifs.addresses) {
    auto f = ifs.flags.find(a.interface);
    const unsigned flags = f == ifs.flags.end() ? 0 : f->second;
    if ((flags & IFF_LOOPBACK) == 0 && (flags & IFF_UP) != 0) candidates.push_back(a);
  }
  if (candidates.size() == 1) return candidates[0];
  std::string names;
  for (const LocalAddress& a : candidates) {
    names += (names.empty() ? "" : ", ") + a.interface + " " + Ipv4ToString(a.ipv4);
  }
  return InvalidArgumentError(
      "AF_XDP needs to know its interface: bind to the address of one (--bind ADDRESS) or set "
      "SWITCHML_XDP_IFACE; " +
      (candidates.empty() ? std::string("this host has no non-loopback interface that is up")
                          : "candidates: " + names));
}

// The next hop towards dst through `interface` from /proc/net/route (longest prefix); nullopt
// when no route of the interface covers dst.
std::optional<uint32_t> NextHop(const std::string& interface, uint32_t dst) {
  std::ifstream in("/proc/net/route");
  std::string line;
  std::getline(in, line);  // header
  int best_len = -1;
  uint32_t best_hop = 0;
  while (std::getline(in, line)) {
    std::istringstream f(line);
    std::string iface, dest_hex, gw_hex, flags_hex, refcnt, use, metric, mask_hex;
    if (!(f >> iface >> dest_hex >> gw_hex >> flags_hex >> refcnt >> use >> metric >> mask_hex)) {
      continue;
    }
    if (iface != interface) continue;
    // The fields are in network byte order, printed as a native-endian hex number.
    const uint32_t dest = ntohl(static_cast<uint32_t>(std::stoul(dest_hex, nullptr, 16)));
    const uint32_t gw = ntohl(static_cast<uint32_t>(std::stoul(gw_hex, nullptr, 16)));
    const uint32_t mask = ntohl(static_cast<uint32_t>(std::stoul(mask_hex, nullptr, 16)));
    if ((dst & mask) != dest) continue;
    const int len = __builtin_popcount(mask);
    if (len > best_len) {
      best_len = len;
      best_hop = gw != 0 ? gw : dst;
    }
  }
  if (best_len < 0) return std::nullopt;
  return best_hop;
}

// The kernel's complete neighbour entry for ip on interface, from /proc/net/arp.
std::optional<Mac> ArpLookup(const std::string& interface, uint32_t ip) {
  std::ifstream in("/proc/net/arp");
  std::string line;
  std::getline(in, line);  // header
  const std::string want = Ipv4ToString(ip);
  while (std::getline(in, line)) {
    std::istringstream f(line);
    std::string addr, hwtype, flags_hex, hw, mask, dev;
    if (!(f >> addr >> hwtype >> flags_hex >> hw >> mask >> dev)) continue;
    if (addr != want || dev != interface) continue;
    const unsigned flags = static_cast<unsigned>(std::stoul(flags_hex, nullptr, 16));
    Mac m;
    if ((flags & 0x2) != 0 && ParseMac(hw, &m)) return m;  // ATF_COM: resolved
  }
  return std::nullopt;
}

// ---------------------------------------------------------------------------------------------
// One interface queue of this process: the UMEM, its fill and completion rings, the XDP program.

class XdpPort {
 public:
  static Result<std::shared_ptr<XdpPort>> Get(const LocalAddress& local, const Interfaces& ifs,
                                              const XdpOptions& options);
  ~XdpPort();

  // A socket slot: its index in the XSKMAP, its transmit partition. kResourceExhausted if all
  // kMaxSockets are taken.
  Result<uint32_t> AcquireSlot();
  void ReleaseSlot(uint32_t slot);

  // Creates the AF_XDP socket of a slot (binding it to the queue; the first one decides
  // zero-copy or copy mode, and attaches the XDP program).
  Result<xsk_socket*> CreateSocket(uint32_t slot, xsk_ring_cons* rx, xsk_ring_prod* tx);
  // Steers port to the socket of slot (or stops steering it).
  Status Steer(uint16_t port, uint32_t slot, int xsk_fd);
  void Unsteer(uint16_t port, uint32_t slot);

  // Takes the frame of a received descriptor's address (xdp::RxFrames::Take): its frame, or
  // UINT64_MAX if the kernel handed over something that is not its to give.
  uint64_t TakeRx(uint64_t addr) { return rx_frames_.Take(addr); }
  // Gives received frames back to the kernel (the fill ring; what it has no room for waits and
  // goes on a later call).
  void Refill(std::span<const uint64_t> frames);
  // Frames waiting for room in the fill ring (Refill({}) retries them).
  bool HasStash() const { return rx_frames_.stashed() > 0; }
  uint64_t short_refills() const { return rx_frames_.short_refills(); }
  // Moves completed transmit frames into their sockets' inboxes, then hands slot's inbox over.
  void Reap(uint32_t slot, std::vector<uint64_t>* completed);

  uint8_t* area() const { return area_; }
  uint64_t area_bytes() const { return uint64_t{kNumFrames} * kFrameSize; }
  const std::string& interface() const { return interface_; }
  const Mac& mac() const { return mac_; }
  const std::string& mode() const { return mode_; }
  uint64_t TxBase(uint32_t slot) const {
    return (uint64_t{kRxFrames} + uint64_t{slot} * kTxFrames) * kFrameSize;
  }

 private:
  XdpPort(std::string interface, int ifindex, const XdpOptions& options, Mac mac)
      : interface_(std::move(interface)),
        ifindex_(ifindex),
        queue_(options.queue),
        attach_mode_(options.mode),
        copy_only_(options.copy_only),
        mac_(mac) {}
  // debug: XdpOptions::debug, print libbpf's warnings (the verifier's log) while loading.
  Status Init(bool debug);
  Status LoadProgram(bool debug);
  Status AttachProgram();
  Status CreateUmem();

  const std::string interface_;
  const int ifindex_;
  const uint32_t queue_;
  const XdpAttachMode attach_mode_;
  const bool copy_only_;  // never try zero-copy
  const Mac mac_;
  uint8_t* area_ = nullptr;
  xsk_umem* umem_ = nullptr;
  xsk_ring_prod fill_{};
  xsk_ring_cons comp_{};
  bpf_object* object_ = nullptr;
  int prog_fd_ = -1;
  int xsks_fd_ = -1;
  int ports_fd_ = -1;
  int lock_fd_ = -1;           // LockInterface's, held while the port lives
  uint32_t attach_flags_ = 0;  // XDP_FLAGS_*_MODE the program is attached with; 0: not attached
  bool zero_copy_ = false;
  bool sockets_made_ = false;
  std::string mode_;  // "native, copy" ...
  std::mutex mu_;     // the fill and completion rings, slots_, inbox_
  std::array<bool, kMaxSockets> slots_{};
  std::array<std::vector<uint64_t>, kMaxSockets> inbox_;
  xdp::RxFrames rx_frames_{kRxFrames, kFrameSize};  // the fill ring's frames, under mu_
};

std::mutex registry_mu;
std::map<std::pair<int, uint32_t>, std::weak_ptr<XdpPort>>& Registry() {
  static auto* r = new std::map<std::pair<int, uint32_t>, std::weak_ptr<XdpPort>>();
  return *r;
}

// One process per interface: the XDP program is the interface's, whatever queue a process binds,
// so a second port on the interface (another process, or this one on another queue) would
// replace the first one's program, and on closing remove it, silently cutting the first one
// off. A lock file per network namespace and interface, held while the port lives (the kernel
// drops it when the process dies), refuses that second port, and makes a switchml program
// found attached while the lock is ours truly stale. Returns the lock's descriptor.
Result<int> LockInterface(const std::string& interface, int ifindex, const std::string& lock_dir) {
  struct stat ns {};
  if (::stat("/proc/self/ns/net", &ns) != 0) {
    return InternalError("AF_XDP: cannot identify this network namespace (/proc/self/ns/net): " +
                         ErrnoText(errno));
  }
  // This user's own directory (private_dir.h; issue 28, found 2 and 3: the shared
  // /tmp/switchml-xdp, mode 1777, let other users plant symbolic links there and hold the lock,
  // keeping the switch from starting); XdpOptions::lock_dir ($SWITCHML_XDP_LOCK_DIR) chooses
  // another.
  ASSIGN_OR_RETURN(PrivateDirectory dir,
                   PrivateDirectory::Open(PrivateDirectoryPath("xdp", lock_dir),
                                          "AF_XDP interface lock files", "SWITCHML_XDP_LOCK_DIR"));
  const std::string name = std::to_string(ns.st_ino) + "-" + std::to_string(ifindex) + ".lock";
  const std::string path = dir.path() + "/" + name;
  Result<int> opened = dir.OpenFile(name, O_RDONLY);
  if (!opened.ok()) return FailedPreconditionError("AF_XDP: " + opened.status().message());
  const int fd = *opened;
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    ::close(fd);
    if (err == EWOULDBLOCK) {
      return FailedPreconditionError(
          "AF_XDP: interface " + interface +
          " is used by another switchml process (or by this one on another queue): AF_XDP "
          "allows one switchml process per interface, whatever SWITCHML_XDP_QUEUE says (the XDP "
          "program is the interface's); give each process an interface of its own");
    }
    return FailedPreconditionError("AF_XDP: cannot lock " + path + ": " + ErrnoText(err));
  }
  return fd;
}

Result<std::shared_ptr<XdpPort>> XdpPort::Get(const LocalAddress& local, const Interfaces& ifs,
                                              const XdpOptions& options) {
  const int ifindex = static_cast<int>(::if_nametoindex(local.interface.c_str()));
  if (ifindex == 0) {
    return NotFoundError("AF_XDP: no interface '" + local.interface + "': " + ErrnoText(errno));
  }
  std::lock_guard<std::mutex> lock(registry_mu);
  auto& weak = Registry()[{ifindex, options.queue}];
  if (auto port = weak.lock()) return port;
  auto m = ifs.macs.find(local.interface);
  const Mac mac = m == ifs.macs.end() ? Mac{} : m->second;
  std::shared_ptr<XdpPort> port(new XdpPort(local.interface, ifindex, options, mac));
  ASSIGN_OR_RETURN(port->lock_fd_, LockInterface(local.interface, ifindex, options.lock_dir));
  RETURN_IF_ERROR(port->Init(options.debug));
  weak = port;
  return port;
}

Status XdpPort::Init(bool debug) {
  void* area = ::mmap(nullptr, area_bytes(), PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
  if (area == MAP_FAILED) {
    return ResourceExhaustedError("AF_XDP: cannot map " + std::to_string(area_bytes() >> 20) +
                                  " MiB of packet memory: " + ErrnoText(errno));
  }
  area_ = static_cast<uint8_t*>(area);
  RETURN_IF_ERROR(CreateUmem());
  return LoadProgram(debug);
}

Status XdpPort::CreateUmem() {
  xsk_umem_config config{};
  config.fill_size = kFillRing;
  config.comp_size = kCompRing;
  config.frame_size = kFrameSize;
  config.frame_headroom = 0;
  config.flags = 0;
  const int r = xsk_umem__create(&umem_, area_, area_bytes(), &fill_, &comp_, &config);
  if (r != 0) {
    umem_ = nullptr;
    return FailedPreconditionError("AF_XDP: cannot register packet memory (UMEM) for " +
                                   interface_ + ": " + ErrnoText(-r) + PermissionHint(-r) +
                                   (-r == EAFNOSUPPORT ? " (a kernel without AF_XDP?)" : ""));
  }
  // Every receive frame starts in the fill ring.
  rx_frames_.FillAll(&fill_);
  return Status();
}

Status XdpPort::LoadProgram(bool debug) {
  // libbpf's printer is one per process: the last port loaded sets it.
  if (debug) {
    libbpf_set_print([](enum libbpf_print_level level, const char* format, va_list args) -> int {
      return level == LIBBPF_WARN ? std::vfprintf(stderr, format, args) : 0;
    });
  } else {
    libbpf_set_print([](enum libbpf_print_level, const char*, va_list) -> int { return 0; });
  }
  // Load with multi-buffer support first (lets native XDP attach on veth with a jumbo MTU), and
  // without it on kernels that do not know the flag.
  int err = 0;
  for (bool frags : {true, false}) {
    bpf_object_open_opts opts{};
    opts.sz = sizeof opts;
    opts.object_name = "switchml_xdp_steer";
    bpf_object* obj =
        bpf_object__open_mem(switchml_xdp_steer_bpf, switchml_xdp_steer_bpf_size, &opts);
    if (obj == nullptr) {
      return InternalError("AF_XDP: cannot open the embedded XDP program: " + ErrnoText(errno));
    }
    bpf_program* prog = bpf_object__find_program_by_name(obj, "switchml_steer");
    if (prog == nullptr) {
      bpf_object__close(obj);
      return InternalError("AF_XDP: the embedded XDP object has no program switchml_steer");
    }
    if (frags) bpf_program__set_flags(prog, bpf_program__flags(prog) | BPF_F_XDP_HAS_FRAGS);
    err = bpf_object__load(obj);
    if (err == 0) {
      object_ = obj;
      prog_fd_ = bpf_program__fd(prog);
      xsks_fd_ = bpf_object__find_map_fd_by_name(obj, "switchml_xsks");
      ports_fd_ = bpf_object__find_map_fd_by_name(obj, "switchml_ports");
      return Status();
    }
    bpf_object__close(obj);
  }
  return FailedPreconditionError(
      "AF_XDP: the kernel refused to load the XDP program: " + ErrnoText(-err) +
      PermissionHint(-err) + " (SWITCHML_XDP_DEBUG=1 prints the verifier's log)");
}

Status XdpPort::AttachProgram() {
  std::vector<uint32_t> tries;
  if (attach_mode_ != XdpAttachMode::kGeneric) tries.push_back(XDP_FLAGS_DRV_MODE);
  if (attach_mode_ != XdpAttachMode::kNative) tries.push_back(XDP_FLAGS_SKB_MODE);
  std::string failures;
  for (uint32_t flags : tries) {
    int r = bpf_xdp_attach(ifindex_, prog_fd_, flags | XDP_FLAGS_UPDATE_IF_NOEXIST, nullptr);
    if (r == -EEXIST || r == -EBUSY) {
      // Another program is attached. If it is ours, it was left by a process that died (we
      // hold the interface's lock, LockInterface: no live switchml process uses it): replace
      // it; otherwise refuse.
      uint32_t id = 0;
      bpf_xdp_query_id(ifindex_, 0, &id);
      std::string name = "?";
      const int fd = id != 0 ? bpf_prog_get_fd_by_id(id) : -1;
      if (fd >= 0) {
        bpf_prog_info info{};
        uint32_t len = sizeof info;
        if (bpf_obj_get_info_by_fd(fd, &info, &len) == 0) name = info.name;
        ::close(fd);
      }
      if (name != "switchml_steer") {
        return FailedPreconditionError(
            "AF_XDP: interface " + interface_ + " already has an XDP program (id " +
            std::to_string(id) + ", '" + name +
            "'); switchml does not replace another program: remove it (ip link set dev " +
            interface_ + " xdp off) or use another interface");
      }
      LOG(kWarning, kTransport) << "AF_XDP: replacing a stale switchml XDP program (id " << id
                                << ") on " << interface_;
      bpf_xdp_detach(ifindex_, XDP_FLAGS_DRV_MODE, nullptr);
      bpf_xdp_detach(ifindex_, XDP_FLAGS_SKB_MODE, nullptr);
      r = bpf_xdp_attach(ifindex_, prog_fd_, flags | XDP_FLAGS_UPDATE_IF_NOEXIST, nullptr);
    }
    if (r == 0) {
      attach_flags_ = flags;
      return Status();
    }
    failures += std::string(failures.empty() ? "" : "; ") +
                (flags == XDP_FLAGS_DRV_MODE ? "native: " : "generic: ") + ErrnoText(-r) +
                PermissionHint(-r);
  }
  return FailedPreconditionError("AF_XDP: cannot attach the XDP program to " + interface_ + " (" +
                                 failures + ")");
}

Result<xsk_socket*> XdpPort::CreateSocket(uint32_t slot, xsk_ring_cons* rx, xsk_ring_prod* tx) {
  std::lock_guard<std::mutex> lock(mu_);
  xsk_socket_config config{};
  config.rx_size = kRxRing;
  config.tx_size = kTxRing;
  config.libxdp_flags = XSK_LIBXDP_FLAGS__INHIBIT_PROG_LOAD;
  xsk_socket* xsk = nullptr;
  if (sockets_made_) {
    const int r = xsk_socket__create_shared(&xsk, interface_.c_str(), queue_, umem_, rx, tx, &fill_,
                                            &comp_, &config);
    if (r != 0) {
      return FailedPreconditionError("AF_XDP: cannot add socket " + std::to_string(slot) + " on " +
                                     interface_ + " queue " + std::to_string(queue_) + ": " +
                                     ErrnoText(-r) + PermissionHint(-r));
    }
    return xsk;
  }
  // The first socket: zero-copy if the driver allows it, else copy mode. A failed bind leaves
  // the UMEM unusable for another, so it is made again. A queue that a socket just closed stays
  // busy until the kernel has released it (deferred work): retried for a second.
  const bool allow_zero_copy = !copy_only_;
  int r = -EOPNOTSUPP;
  for (int attempt = 0; attempt < 40; ++attempt) {
    for (bool zero_copy : {true, false}) {
      if (zero_copy && !allow_zero_copy) continue;
      if (umem_ == nullptr) RETURN_IF_ERROR(CreateUmem());
      config.bind_flags = (zero_copy ? XDP_ZEROCOPY : XDP_COPY) | XDP_USE_NEED_WAKEUP;
      r = xsk_socket__create(&xsk, interface_.c_str(), queue_, umem_, rx, tx, &config);
      if (r == 0) {
        zero_copy_ = zero_copy;
        break;
      }
      xsk_umem__delete(umem_);
      umem_ = nullptr;
      fill_ = {};
      comp_ = {};
    }
    if (r != -EBUSY) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(25));
  }
  if (r != 0) {
    std::string hint = PermissionHint(-r);
    if (-r == EBUSY) {
      hint = " (queue " + std::to_string(queue_) +
             " is used by another AF_XDP program, e.g. another switchml process on this "
             "interface: one process per interface queue; SWITCHML_XDP_QUEUE picks another)";
    } else if (-r == EINVAL) {
      hint = " (no queue " + std::to_string(queue_) + " on " + interface_ + "?)";
    }
    return FailedPreconditionError("AF_XDP: cannot bind a socket to " + interface_ + " queue " +
                                   std::to_string(queue_) + ": " + ErrnoText(-r) + hint);
  }
  Status attached = AttachProgram();
  if (!attached.ok()) {
    xsk_socket__delete(xsk);
    return attached;
  }
  sockets_made_ = true;
  mode_ = std::string(attach_flags_ == XDP_FLAGS_DRV_MODE ? "native" : "generic") + " XDP, " +
          (zero_copy_ ? "zero-copy" : "copy");
  LOG(kInfo, kTransport) << "AF_XDP on " << interface_ << " queue " << queue_ << ": " << mode_;
  return xsk;
}

Status XdpPort::Steer(uint16_t port, uint32_t slot, int xsk_fd) {
  const uint16_t key = htons(port);
  int r = bpf_map_update_elem(xsks_fd_, &slot, &xsk_fd, BPF_ANY);
  if (r == 0) r = bpf_map_update_elem(ports_fd_, &key, &slot, BPF_ANY);
  if (r != 0) {
    return InternalError("AF_XDP: cannot steer UDP port " + std::to_string(port) +
                         " to its socket: " + ErrnoText(-r));
  }
  return Status();
}

void XdpPort::Unsteer(uint16_t port, uint32_t slot) {
  const uint16_t key = htons(port);
  bpf_map_delete_elem(ports_fd_, &key);
  bpf_map_delete_elem(xsks_fd_, &slot);
}

Result<uint32_t> XdpPort::AcquireSlot() {
  std::lock_guard<std::mutex> lock(mu_);
  for (uint32_t s = 0; s < kMaxSockets; ++s) {
    if (!slots_[s]) {
      slots_[s] = true;
      inbox_[s].clear();
      return s;
    }
  }
  return ResourceExhaustedError("AF_XDP: at most " + std::to_string(kMaxSockets) +
                                " transports (threads) per interface queue and process");
}

void XdpPort::ReleaseSlot(uint32_t slot) {
  std::lock_guard<std::mutex> lock(mu_);
  slots_[slot] = false;
  inbox_[slot].clear();
}

void XdpPort::Refill(std::span<const uint64_t> frames) {
  if (frames.empty() && !HasStash()) return;
  std::lock_guard<std::mutex> lock(mu_);
  rx_frames_.GiveBack(&fill_, frames);
}

void XdpPort::Reap(uint32_t slot, std::vector<uint64_t>* completed) {
  std::lock_guard<std::mutex> lock(mu_);
  uint32_t index = 0;
  const uint32_t n = xsk_ring_cons__peek(&comp_, kCompRing, &index);
  for (uint32_t i = 0; i < n; ++i) {
    const uint64_t addr = *xsk_ring_cons__comp_addr(&comp_, index + i);
    const uint64_t frame = addr / kFrameSize;
    if (frame < kRxFrames) continue;
    const uint32_t owner = static_cast<uint32_t>((frame - kRxFrames) / kTxFrames);
    if (owner < kMaxSockets && slots_[owner]) inbox_[owner].push_back(addr - addr % kFrameSize);
  }
  if (n > 0) xsk_ring_cons__release(&comp_, n);
  completed->swap(inbox_[slot]);
  inbox_[slot].clear();
}

XdpPort::~XdpPort() {
  if (attach_flags_ != 0) {
    bpf_xdp_attach_opts opts{};
    opts.sz = sizeof opts;
    opts.old_prog_fd = prog_fd_;
    bpf_xdp_detach(ifindex_, attach_flags_, &opts);  // only if it is still ours
  }
  if (object_ != nullptr) bpf_object__close(object_);
  if (umem_ != nullptr) xsk_umem__delete(umem_);
  if (area_ != nullptr) ::munmap(area_, area_bytes());
  if (lock_fd_ >= 0) ::close(lock_fd_);
}

// ---------------------------------------------------------------------------------------------
// The transport: one AF_XDP socket.

class XdpTransport final : public Transport {
 public:
  XdpTransport(std::shared_ptr<XdpPort> port, uint32_t slot, LocalAddress local, uint16_t udp_port,
               int reserve_fd, int wake_fd, size_t max_datagram, std::vector<LocalAddress> locals,
               std::map<std::string, Mac> macs)
      : port_(std::move(port)),
        slot_(slot),
        local_(std::move(local)),
        udp_port_(udp_port),
        reserve_fd_(reserve_fd),
        wake_fd_(wake_fd),
        max_datagram_(max_datagram),
        locals_(std::move(locals)),
        macs_(std::move(macs)),
        tx_base_(port_->TxBase(slot)),
        slot_frame_(kTxBuffers, kNoFrame),
        frame_slot_(kTxFrames, -1),
        in_flight_(kTxFrames, 0),
        fallback_(kTxBuffers * kTxPayloadCapacity) {
    free_.reserve(kTxFrames);
    for (uint32_t i = kTxFrames; i-- > 0;) free_.push_back(tx_base_ + uint64_t{i} * kFrameSize);
    lent_.reserve(kRxRing);
    desc_.reserve(kMaxPerSend);
  }

  Status Open() {
    ASSIGN_OR_RETURN(xsk_, port_->CreateSocket(slot_, &rx_, &tx_));
    xsk_fd_ = xsk_socket__fd(xsk_);
    return port_->Steer(udp_port_, slot_, xsk_fd_);
  }

  ~XdpTransport() override {
    if (xsk_ != nullptr) {
      xdp_statistics st{};
      socklen_t len = sizeof st;
      if (::getsockopt(xsk_fd_, SOL_XDP, XDP_STATISTICS, &st, &len) == 0) {
        LOG(kInfo, kTransport) << "AF_XDP " << local_endpoint().ToString() << " closing: sent "
                               << counts_.datagrams_sent.Get() << ", received "
                               << counts_.datagrams_received.Get() << ", kernel dropped "
                               << st.rx_dropped << " (RX ring full " << st.rx_ring_full
                               << ", fill ring empty " << st.rx_fill_ring_empty_descs
                               << "), TX invalid " << st.tx_invalid_descs << ", TX ring full "
                               << counts_.send_buffer_full.Get() << ", not parsed "
                               << dropped_.Get() << ", fill ring short " << port_->short_refills();
      }
      port_->Unsteer(udp_port_, slot_);
      Kick().IgnoreError();
      // Let frames in flight complete before the slot's partition can be reused.
      const auto deadline = Clock::now() + std::chrono::milliseconds(100);
      while (InFlight() > 0 && Clock::now() < deadline) {
        ReapCompleted();
        if (InFlight() > 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      port_->Refill(lent_);
      lent_.clear();
      // Frames still in the RX ring go back to the fill ring too.
      uint32_t index = 0;
      const uint32_t n = xsk_ring_cons__peek(&rx_, kRxRing, &index);
      for (uint32_t i = 0; i < n; ++i) {
        const uint64_t frame = port_->TakeRx(xsk_ring_cons__rx_desc(&rx_, index + i)->addr);
        if (frame != kNoFrame) lent_.push_back(frame);
      }
      xsk_ring_cons__release(&rx_, n);
      port_->Refill(lent_);
      xsk_socket__delete(xsk_);
    }
    port_->ReleaseSlot(slot_);
    ::close(reserve_fd_);
    ::close(wake_fd_);
  }

  Endpoint local_endpoint() const override { return Endpoint{local_.ipv4, udp_port_}; }
  size_t max_datagram_bytes() const override { return max_datagram_; }
  std::string name() const override {
    return "xdp (" + local_.interface + ", " + port_->mode() + ")";
  }

  std::span<uint8_t> TxBuffer(size_t index) override {
    CHECK_LT(index, kTxBuffers) << "TxBuffer index out of range";
    uint64_t& frame = slot_frame_[index];
    if (frame != kNoFrame && in_flight_[Local(frame)] != 0) {
      // Sent and not yet completed: leave it to complete on its own; lend a free frame.
      frame_slot_[Local(frame)] = -1;
      frame = kNoFrame;
    }
    if (frame == kNoFrame) {
      if (free_.empty()) ReapCompleted();
      if (free_.empty()) {
        // Every frame is in flight: lend plain memory (Send copies it).
        return {fallback_.data() + index * kTxPayloadCapacity, max_datagram_};
      }
      frame = free_.back();
      free_.pop_back();
      frame_slot_[Local(frame)] = static_cast<int32_t>(index);
    }
    return {port_->area() + frame + kTxPayloadOffset, max_datagram_};
  }

  Result<size_t> Send(std::span<const TxDatagram> batch) override {
    size_t taken = 0;
    send_now_ = Clock::now();
    if (send_now_ - last_ip_checked_ > kNeighbourRecheck) {
      last_ip_checked_ = send_now_;
      last_mac_ = nullptr;  // let the next lookup go through the table's recheck
    }
    ReapCompleted();
    while (taken < batch.size()) {
      const uint32_t want = static_cast<uint32_t>(std::min(batch.size() - taken, kMaxPerSend));
      const uint32_t room = xsk_prod_nb_free(&tx_, want);
      if (room == 0) {
        RETURN_IF_ERROR(Kick());
        if (xsk_prod_nb_free(&tx_, 1) == 0) {
          counts_.send_buffer_full.Add(1);
          break;
        }
        continue;
      }
      desc_.clear();
      bool out_of_frames = false;
      size_t i = taken;
      for (; i < batch.size() && desc_.size() < std::min(want, room); ++i) {
        const TxDatagram& d = batch[i];
        if (d.data.size() > kTxPayloadCapacity) {
          counts_.send_errors.Add(1);
          continue;
        }
        const Mac* mac = Neighbour(d.destination.ipv4);
        if (mac == nullptr) {
          counts_.send_errors.Add(1);
          continue;
        }
        uint64_t frame = InPlaceFrame(d.data);
        if (frame == kNoFrame) {
          if (free_.empty()) ReapCompleted();
          if (free_.empty()) {
            out_of_frames = true;
            break;
          }
          frame = free_.back();
          free_.pop_back();
          std::memcpy(port_->area() + frame + kTxPayloadOffset, d.data.data(), d.data.size());
        }
        in_flight_[Local(frame)] = 1;
        ++in_flight_count_;
        WriteHeaders(port_->area() + frame + kTxPacketOffset, *mac, d.destination, d.data.size());
        desc_.push_back(
            {frame + kTxPacketOffset, static_cast<uint32_t>(kHeaderBytes + d.data.size()), 0});
      }
      if (!desc_.empty()) {
        uint32_t index = 0;
        const uint32_t n = static_cast<uint32_t>(desc_.size());
        CHECK_EQ(xsk_ring_prod__reserve(&tx_, n, &index), n);
        for (uint32_t k = 0; k < n; ++k) *xsk_ring_prod__tx_desc(&tx_, index + k) = desc_[k];
        xsk_ring_prod__submit(&tx_, n);
        counts_.datagrams_sent.Add(n);
      }
      taken = i;
      Status kicked = Kick();
      if (!kicked.ok()) return kicked;
      if (out_of_frames) {
        counts_.send_buffer_full.Add(1);
        break;
      }
    }
    return taken;
  }

  Result<size_t> Receive(std::span<RxDatagram> batch, std::chrono::nanoseconds timeout) override {
    if (!lent_.empty() || port_->HasStash()) {
      port_->Refill(lent_);
      lent_.clear();
    }
    RETURN_IF_ERROR(broken_);
    if (batch.empty()) return size_t{0};
    const bool forever = timeout > std::chrono::hours(24);
    const Clock::time_point deadline =
        forever ? Clock::time_point::max() : Clock::now() + std::max(timeout, timeout.zero());
    for (;;) {
      const size_t n = Harvest(batch);
      if (n > 0) return n;
      RETURN_IF_ERROR(broken_);
      if (TxOutstanding() > 0) Kick().IgnoreError();
      if (timeout <= timeout.zero()) return size_t{0};
      int wait_ms = -1;
      if (!forever) {
        const auto remaining = deadline - Clock::now();
        if (remaining <= remaining.zero()) return size_t{0};
        wait_ms = static_cast<int>(std::chrono::ceil<std::chrono::milliseconds>(remaining).count());
      }
      pollfd fds[2] = {{xsk_fd_, POLLIN, 0}, {wake_fd_, POLLIN, 0}};
      const int rc = ::poll(fds, 2, wait_ms);
      if (rc < 0) {
        if (errno == EINTR) continue;
        return InternalError("poll on AF_XDP socket " + local_endpoint().ToString() +
                             " failed: " + ErrnoText(errno));
      }
      if (fds[1].revents & POLLIN) {
        uint64_t value;
        [[maybe_unused]] ssize_t ignored = ::read(wake_fd_, &value, sizeof value);
        return size_t{0};
      }
      if (fds[0].revents & (POLLERR | POLLNVAL)) {
        return UnavailableError("AF_XDP socket on " + local_.interface +
                                " reported an error (interface gone or down?)");
      }
      if (rc == 0 && !forever && Clock::now() >= deadline) {
        // One last look: the ring may have filled just as poll gave up.
        return Harvest(batch);
      }
    }
  }

  void Wake() override {
    const uint64_t one = 1;
    [[maybe_unused]] ssize_t ignored = ::write(wake_fd_, &one, sizeof one);
  }

  TransportCounters counters() const override { return counts_.Snapshot(); }

 private:
  static constexpr uint64_t kNoFrame = UINT64_MAX;

  size_t Local(uint64_t frame) const {
    return static_cast<size_t>((frame - tx_base_) / kFrameSize);
  }

  // The frame of a datagram that lies at the payload offset of one of our lent frames not yet
  // sent in place (its headers are written in front of it); kNoFrame otherwise (copied).
  uint64_t InPlaceFrame(std::span<const uint8_t> data) const {
    const uint8_t* p = data.data();
    const uint8_t* area = port_->area();
    if (p < area + tx_base_ || p >= area + tx_base_ + uint64_t{kTxFrames} * kFrameSize) {
      return kNoFrame;
    }
    const uint64_t offset = static_cast<uint64_t>(p - area);
    const uint64_t frame = offset - offset % kFrameSize;
    if (offset - frame != kTxPayloadOffset) return kNoFrame;
    if (in_flight_[Local(frame)] != 0 || frame_slot_[Local(frame)] < 0) return kNoFrame;
    return frame;
  }

  uint32_t TxOutstanding() const {
    return *tx_.producer - __atomic_load_n(tx_.consumer, __ATOMIC_ACQUIRE);
  }
  size_t InFlight() const { return in_flight_count_; }

  // Makes the kernel send what the TX ring holds (copy mode sends a few dozen per call).
  Status Kick() {
    for (int round = 0; round < 64 && TxOutstanding() > 0; ++round) {
      if (!xsk_ring_prod__needs_wakeup(&tx_) && round > 0) break;
      const ssize_t r = ::sendto(xsk_fd_, nullptr, 0, MSG_DONTWAIT, nullptr, 0);
      counts_.send_calls.Add(1);
      if (r >= 0) continue;
      const int err = errno;
      if (err == EAGAIN || err == EINTR) continue;
      if (err == EBUSY || err == ENOBUFS) break;  // the device is busy: later
      if (err == ENETDOWN || err == ENXIO) {
        return UnavailableError("AF_XDP send on " + local_.interface +
                                " failed: " + ErrnoText(err) + " (interface down or gone)");
      }
      return UnavailableError("AF_XDP send on " + local_.interface + " failed: " + ErrnoText(err));
    }
    return Status();
  }

  void ReapCompleted() {
    port_->Reap(slot_, &completed_);
    for (uint64_t frame : completed_) {
      const size_t l = Local(frame);
      if (in_flight_[l] == 0) continue;
      in_flight_[l] = 0;
      --in_flight_count_;
      // A frame still lent by TxBuffer stays with its slot (the caller may send it again);
      // others are free.
      if (frame_slot_[l] < 0) free_.push_back(frame);
    }
    completed_.clear();
  }

  // Takes what the RX ring holds into batch; frames are lent until the next Receive.
  size_t Harvest(std::span<RxDatagram> batch) {
    size_t n = 0;
    uint64_t truncated = 0;
    for (int round = 0; round < 4 && n == 0; ++round) {
      uint32_t index = 0;
      const uint32_t got = xsk_ring_cons__peek(&rx_, static_cast<uint32_t>(batch.size()), &index);
      if (got == 0) break;
      counts_.receive_calls.Add(1);
      for (uint32_t k = 0; k < got; ++k) {
        const xdp_desc* d = xsk_ring_cons__rx_desc(&rx_, index + k);
        const uint64_t addr = xsk_umem__extract_addr(d->addr) + xsk_umem__extract_offset(d->addr);
        const uint64_t frame = port_->TakeRx(addr);
        if (frame == kNoFrame || addr - frame + d->len > kFrameSize) {
          // Not a frame the kernel had from us, or one we hold: its memory cannot be trusted.
          // Not lent; Receive reports it (the kernel misbehaved).
          if (broken_.ok()) {
            broken_ = InternalError(
                "AF_XDP socket on " + local_.interface +
                ": the kernel delivered a packet at UMEM offset " + std::to_string(addr) +
                " (length " + std::to_string(d->len) +
                "), which is not a receive frame the kernel holds (outside them, past a frame's "
                "end, or one this process holds already); the packet memory can no longer be "
                "trusted");
          }
          if (frame != kNoFrame) lent_.push_back(frame);
          dropped_.Add(1);
          continue;
        }
        lent_.push_back(frame);
        const uint8_t* pkt = port_->area() + addr;
        if (Parse(pkt, d->len, &batch[n])) {
          truncated += batch[n].truncated ? 1 : 0;
          ++n;
        } else {
          dropped_.Add(1);
        }
      }
      xsk_ring_cons__release(&rx_, got);
    }
    if (n > 0) counts_.datagrams_received.Add(n);
    if (truncated > 0) counts_.truncated.Add(truncated);
    return n;
  }

  // One frame codec for the raw transports (frame.h). The UDP checksum is not verified: a veth
  // peer's kernel may hand over a checksum it left to offload (only the pseudo-header's sum).
  bool Parse(const uint8_t* pkt, uint32_t len, RxDatagram* out) const {
    const ParsedFrame f =
        ParseFrame({pkt, len}, len,
                   FrameFilter{local_.ipv4, udp_port_, /*verify_ip_checksum=*/true,
                               /*verify_udp_checksum=*/false});
    if (f.verdict != FrameVerdict::kUdp || !f.whole) return false;
    out->data = f.payload.first(std::min(f.payload_bytes, max_datagram_));
    out->truncated = f.payload_bytes > max_datagram_;
    out->source = f.source;
    return true;
  }

  void WriteHeaders(uint8_t* p, const Mac& dst_mac, const Endpoint& dst, size_t payload) {
    WriteFrameHeaders(p, dst_mac, port_->mac(), Endpoint{local_.ipv4, udp_port_}, dst, payload,
                      ip_id_++, /*udp_checksum=*/true);
  }

  // The MAC address to send to ip; nullptr if it cannot be found (the datagram is dropped).
  // Entries are looked up again in the kernel's table every kNeighbourRecheck (a host whose
  // address moved to another MAC), without waiting.
  const Mac* Neighbour(uint32_t ip) {
    if (ip == last_ip_ && last_mac_ != nullptr) return last_mac_;
    auto it = neighbours_.find(ip);
    if (it == neighbours_.end()) {
      std::optional<Mac> m = ResolveNeighbour(ip);
      if (!m) return nullptr;
      it = neighbours_.emplace(ip, NeighbourEntry{*m, send_now_}).first;
    } else if (send_now_ - it->second.checked > kNeighbourRecheck) {
      it->second.checked = send_now_;
      if (const std::optional<uint32_t> hop = NextHop(local_.interface, ip)) {
        if (auto m = ArpLookup(local_.interface, *hop)) it->second.mac = *m;
      }
    }
    last_ip_ = ip;
    last_mac_ = &it->second.mac;
    return last_mac_;
  }

  std::optional<Mac> ResolveNeighbour(uint32_t ip) {
    // An address of this host: the MAC of its interface (e.g. two ends of a veth pair).
    for (const LocalAddress& a : locals_) {
      if (a.ipv4 == ip) {
        auto m = macs_.find(a.interface);
        if (m != macs_.end()) return m->second;
      }
    }
    const std::optional<uint32_t> hop = NextHop(local_.interface, ip);
    if (!hop) {
      if (warned_.insert(ip).second) {
        LOG(kWarning, kTransport) << "AF_XDP: no route to " << Ipv4ToString(ip) << " through "
                                  << local_.interface << "; datagrams to it are dropped";
      }
      return std::nullopt;
    }
    if (auto m = ArpLookup(local_.interface, *hop)) return m;
    // Ask the kernel to resolve it: a datagram to the discard port makes it send ARP.
    sockaddr_in sin{};
    sin.sin_family = AF_INET;
    sin.sin_addr.s_addr = htonl(ip);
    sin.sin_port = htons(9);
    const auto deadline = Clock::now() + std::chrono::milliseconds(1000);
    for (int attempt = 0; Clock::now() < deadline; ++attempt) {
      if (attempt % 100 == 0) {
        [[maybe_unused]] ssize_t ignored =
            ::sendto(reserve_fd_, nullptr, 0, MSG_DONTWAIT, reinterpret_cast<const sockaddr*>(&sin),
                     sizeof sin);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
      if (auto m = ArpLookup(local_.interface, *hop)) return m;
    }
    if (warned_.insert(ip).second) {
      LOG(kWarning, kTransport) << "AF_XDP: no neighbour entry for " << Ipv4ToString(*hop) << " on "
                                << local_.interface << " (ARP unanswered); datagrams to "
                                << Ipv4ToString(ip) << " are dropped until it resolves";
    }
    return std::nullopt;
  }

  const std::shared_ptr<XdpPort> port_;
  const uint32_t slot_;
  const LocalAddress local_;
  const uint16_t udp_port_;
  const int reserve_fd_;
  const int wake_fd_;
  const size_t max_datagram_;
  const std::vector<LocalAddress> locals_;
  const std::map<std::string, Mac> macs_;
  const uint64_t tx_base_;
  xsk_socket* xsk_ = nullptr;
  int xsk_fd_ = -1;
  xsk_ring_cons rx_{};
  xsk_ring_prod tx_{};
  // Transmit frames: the frame each TxBuffer index lends, the index each frame is lent to (-1:
  // none), which are in flight, and the free ones.
  std::vector<uint64_t> slot_frame_;
  std::vector<int32_t> frame_slot_;
  std::vector<uint8_t> in_flight_;
  size_t in_flight_count_ = 0;
  std::vector<uint64_t> free_;
  std::vector<uint64_t> completed_;
  std::vector<xdp_desc> desc_;
  std::vector<uint8_t> fallback_;  // lent when every frame is in flight
  std::vector<uint64_t> lent_;     // received frames lent until the next Receive
  Status broken_;                  // the kernel handed over a frame that was not its to give
  uint16_t ip_id_ = 0;
  struct NeighbourEntry {
    Mac mac;
    Clock::time_point checked;
  };
  static constexpr std::chrono::seconds kNeighbourRecheck{5};
  std::unordered_map<uint32_t, NeighbourEntry> neighbours_;
  Clock::time_point send_now_{};
  Clock::time_point last_ip_checked_{};
  uint32_t last_ip_ = 0;
  const Mac* last_mac_ = nullptr;
  std::unordered_set<uint32_t> warned_;
  SingleWriterTransportCounters counts_;
  SingleWriterCounter dropped_;
};

// Binds a kernel UDP socket to ip:port to reserve the port; -1 and *in_use on EADDRINUSE.
Result<int> ReservePort(uint32_t ip, uint16_t port, bool* in_use) {
  *in_use = false;
  const int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return UnavailableError("cannot create a UDP socket: " + ErrnoText(errno));
  sockaddr_in sin{};
  sin.sin_family = AF_INET;
  sin.sin_addr.s_addr = htonl(ip);
  sin.sin_port = htons(port);
  if (::bind(fd, reinterpret_cast<const sockaddr*>(&sin), sizeof sin) != 0) {
    const int err = errno;
    ::close(fd);
    *in_use = err == EADDRINUSE;
    return UnavailableError("AF_XDP: cannot reserve UDP port " + Endpoint{ip, port}.ToString() +
                            ": " + ErrnoText(err) +
                            (*in_use ? "; another process holds it: choose another port" : ""));
  }
  return fd;
}

}  // namespace

bool XdpAvailable() { return true; }

Result<std::vector<std::unique_ptr<Transport>>> OpenXdpConsecutive(const TransportOptions& base,
                                                                   size_t count) {
  if (count == 0) return InvalidArgumentError("OpenXdpConsecutive: count must be at least 1");
  if (count > kMaxSockets) {
    return InvalidArgumentError("AF_XDP: at most " + std::to_string(kMaxSockets) +
                                " transports (threads) per process on one interface, not " +
                                std::to_string(count));
  }
  ASSIGN_OR_RETURN(Interfaces ifs, ListInterfaces());
  ASSIGN_OR_RETURN(LocalAddress local, ChooseInterface(ifs, base.bind_ipv4, base.xdp.interface));
  // The ports, reserved with kernel UDP sockets.
  std::vector<int> fds;
  auto close_all = [&fds] {
    for (int fd : fds) ::close(fd);
    fds.clear();
  };
  auto reserve = [&](uint32_t start, bool* in_use) -> Status {
    for (size_t i = 0; i < count; ++i) {
      auto fd = ReservePort(local.ipv4, static_cast<uint16_t>(start + i), in_use);
      if (!fd.ok()) {
        close_all();
        return fd.status();
      }
      fds.push_back(*fd);
    }
    return Status();
  };
  uint32_t start = base.port;
  if (start + count - 1 > 65535) {
    return InvalidArgumentError("AF_XDP: ports from " + std::to_string(start) + " pass 65535");
  }
  bool in_use = false;
  if (start != 0) {
    RETURN_IF_ERROR(reserve(start, &in_use));
  } else {
    std::mt19937 rng(std::random_device{}());
    std::uniform_int_distribution<uint32_t> pick(20000, 31999);
    Status st = UnavailableError("AF_XDP: no free consecutive UDP ports found");
    for (int attempt = 0; attempt < 200; ++attempt) {
      start = pick(rng);
      st = reserve(start, &in_use);
      if (st.ok() || !in_use) break;
    }
    RETURN_IF_ERROR(st);
  }
  auto port = XdpPort::Get(local, ifs, base.xdp);
  if (!port.ok()) {
    close_all();
    return port.status();
  }
  std::vector<std::unique_ptr<Transport>> out;
  for (size_t i = 0; i < count; ++i) {
    auto slot = (*port)->AcquireSlot();
    if (!slot.ok()) {
      for (size_t k = i; k < count; ++k) ::close(fds[k]);
      return slot.status();
    }
    const int wake = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (wake < 0) {
      (*port)->ReleaseSlot(*slot);
      for (size_t k = i; k < count; ++k) ::close(fds[k]);
      return ResourceExhaustedError("cannot create an eventfd: " + ErrnoText(errno));
    }
    auto t = std::make_unique<XdpTransport>(
        *port, *slot, local, static_cast<uint16_t>(start + i), fds[i], wake,
        std::min(base.max_datagram_bytes, kRxPayloadCapacity), ifs.addresses, ifs.macs);
    Status opened = t->Open();
    if (!opened.ok()) {
      t.reset();  // closes fds[i]
      for (size_t k = i + 1; k < count; ++k) ::close(fds[k]);
      return opened;
    }
    out.push_back(std::move(t));
  }
  return out;
}

}  // namespace switchml::transport

#endif  // SWITCHML_HAVE_XDP
