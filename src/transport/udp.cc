#include "transport/udp.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <netinet/udp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <random>
#include <string>

#include "base/check.h"
#include "base/logging.h"
#include "base/status_macros.h"

namespace switchml::transport {
namespace {

std::string ErrnoText(int err) { return std::string(std::strerror(err)); }

sockaddr_in ToSockaddr(const Endpoint& e) {
  sockaddr_in sin{};
  sin.sin_family = AF_INET;
  sin.sin_addr.s_addr = htonl(e.ipv4);
  sin.sin_port = htons(e.port);
  return sin;
}

// Errors of one datagram's destination or size on an unconnected UDP socket: the datagram is
// counted and skipped; the transport itself is fine.
bool IsPerDatagramSendError(int err) {
  switch (err) {
    case ECONNREFUSED:
    case EHOSTUNREACH:
    case ENETUNREACH:
    case EHOSTDOWN:
    case ENETDOWN:
    case EPERM:   // a firewall rule
    case EACCES:  // e.g. a broadcast destination
    case EMSGSIZE:
    case EADDRNOTAVAIL:
    case EINVAL:  // e.g. destination port 0
    case EDESTADDRREQ:
      return true;
    default:
      return false;
  }
}

// An ICMP error of an earlier send, reported by a later receive; nothing to receive.
bool IsAsyncIcmpError(int err) {
  return err == ECONNREFUSED || err == EHOSTUNREACH || err == ENETUNREACH || err == EHOSTDOWN;
}

class FileDescriptor {
 public:
  explicit FileDescriptor(int fd = -1) : fd_(fd) {}
  FileDescriptor(const FileDescriptor&) = delete;
  FileDescriptor& operator=(const FileDescriptor&) = delete;
  ~FileDescriptor() {
    if (fd_ >= 0) ::close(fd_);
  }
  int get() const { return fd_; }
  int release() {
    int fd = fd_;
    fd_ = -1;
    return fd;
  }

 private:
  int fd_;
};

std::string InterfaceName(uint32_t index) {
  char name[IF_NAMESIZE] = {};
  if (::if_indextoname(index, name) == nullptr) return "#" + std::to_string(index);
  return name;
}

// Sets a socket buffer size, trying the privileged *FORCE variant first (it ignores the
// rmem_max/wmem_max limits when we run as root) and falling back silently.
void SetBufferSize(int fd, int force_option, int option, int bytes) {
  if (::setsockopt(fd, SOL_SOCKET, force_option, &bytes, sizeof bytes) == 0) return;
  if (::setsockopt(fd, SOL_SOCKET, option, &bytes, sizeof bytes) != 0) {
    LOG(kDebug, kTransport) << "setsockopt buffer size " << bytes
                            << " failed: " << ErrnoText(errno);
  }
}

// The UDP transport. Owns the socket and the eventfd. All scratch memory for the system calls
// (message headers, iovecs, addresses, control buffers, the receive arena) is sized once at open
// so the packet path does not allocate.
class UdpTransport final : public Transport {
 public:
  UdpTransport(int socket_fd, int wake_fd, Endpoint local, const TransportOptions& options,
               bool gso, bool gro)
      : socket_fd_(socket_fd),
        wake_fd_(wake_fd),
        local_(local),
        max_batch_(options.max_batch),
        max_datagram_(options.max_datagram_bytes),
        gso_(gso),
        gro_(gro),
        tx_headers_(options.max_batch),
        tx_addresses_(options.max_batch),
        tx_control_(options.max_batch),
        tx_iovecs_(options.max_batch * kMaxSegments),
        tx_counts_(options.max_batch),
        rx_slot_bytes_(gro ? kMaxGroBytes : options.max_datagram_bytes + 1),
        rx_messages_(gro ? std::min<size_t>(options.max_batch, kGroMessages) : options.max_batch),
        rx_arena_(rx_messages_ * rx_slot_bytes_),
        rx_headers_(rx_messages_),
        rx_iovecs_(rx_messages_),
        rx_addresses_(rx_messages_),
        rx_control_(rx_messages_),
        rx_segment_(rx_messages_),
        socket_buffer_bytes_(options.udp.socket_buffer_bytes) {}
  ~UdpTransport() override {
    LeaveGroup();
    ::close(socket_fd_);
    ::close(wake_fd_);
  }

  Status JoinGroup(const Endpoint& group, uint32_t interface_index) override {
    LeaveGroup();
    const std::string where =
        "multicast group " + group.ToString() +
        (interface_index == 0 ? " on the loopback interface"
                              : " on interface " + InterfaceName(interface_index));
    FileDescriptor fd(::socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
    if (fd.get() < 0) return UnavailableError("cannot create a socket for " + where);
    const int zero = 0, one = 1;
    // Every worker thread t of the job on this host binds the same group and port.
    ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (socket_buffer_bytes_ > 0) {
      SetBufferSize(fd.get(), SO_RCVBUFFORCE, SO_RCVBUF, socket_buffer_bytes_);
    }
    // Bound to the group's address: only datagrams sent to it arrive.
    const sockaddr_in sin = ToSockaddr(group);
    if (::bind(fd.get(), reinterpret_cast<const sockaddr*>(&sin), sizeof sin) != 0) {
      return UnavailableError("cannot bind to " + where + ": " + ErrnoText(errno));
    }
    ip_mreqn join{};
    join.imr_multiaddr.s_addr = htonl(group.ipv4);
    if (interface_index == 0) {
      join.imr_address.s_addr = htonl(INADDR_LOOPBACK);
    } else {
      join.imr_ifindex = static_cast<int>(interface_index);
    }
    if (::setsockopt(fd.get(), IPPROTO_IP, IP_ADD_MEMBERSHIP, &join, sizeof join) != 0) {
      return UnavailableError("cannot join " + where + ": " + ErrnoText(errno));
    }
    ::setsockopt(fd.get(), IPPROTO_IP, IP_MULTICAST_ALL, &zero, sizeof zero);
    if (gro_ && ::setsockopt(fd.get(), SOL_UDP, UDP_GRO, &one, sizeof one) != 0) {
      return UnavailableError("cannot enable UDP_GRO on " + where);  // (the arena expects it)
    }
    group_fd_ = fd.release();
    return Status();
  }

  void LeaveGroup() override {
    if (group_fd_ < 0) return;
    ::close(group_fd_);
    group_fd_ = -1;
  }

  Endpoint local_endpoint() const override { return local_; }
  size_t max_datagram_bytes() const override { return max_datagram_; }
  std::string name() const override {
    std::string n = gso_ || gro_ ? "udp (" : "udp-plain";
    if (gso_) n += "GSO";
    if (gso_ && gro_) n += ", ";
    if (gro_) n += "GRO";
    if (gso_ || gro_) n += ")";
    return n;
  }

  Result<size_t> Send(std::span<const TxDatagram> batch) override {
    size_t taken = 0;
    while (taken < batch.size()) {
      const size_t messages = PrepareSend(batch.subspan(taken));
      const int r = ::sendmmsg(socket_fd_, tx_headers_.data(), static_cast<unsigned>(messages), 0);
      if (r > 0) {
        // A short count means message r failed; the next call reports its error.
        size_t datagrams = 0;
        for (int i = 0; i < r; ++i) {
          datagrams += tx_counts_[static_cast<size_t>(i)];
          if (tx_counts_[static_cast<size_t>(i)] > 1) segmented_sends_.Add(1);
        }
        taken += datagrams;
        counts_.datagrams_sent.Add(datagrams);
        counts_.send_calls.Add(1);
        continue;
      }
      const int err = r < 0 ? errno : EAGAIN;
      if (err == EINTR) continue;
      if (err == EAGAIN || err == EWOULDBLOCK || err == ENOBUFS) {
        counts_.send_buffer_full.Add(1);
        break;
      }
      if (err == EIO && gso_ && tx_counts_[0] > 1) {
        // The route's device cannot segment (e.g. no checksum offload): stop using GSO.
        LOG(kWarning, kTransport) << "UDP GSO failed on " << local_.ToString()
                                  << " (EIO); falling back to one datagram per message";
        gso_ = false;
        continue;
      }
      if (IsPerDatagramSendError(err)) {
        counts_.send_errors.Add(tx_counts_[0]);
        taken += tx_counts_[0];  // skip the datagram (or segmented run) that failed
        continue;
      }
      return UnavailableError("UDP send from " + local_.ToString() + " failed: " + ErrnoText(err));
    }
    return taken;
  }

  Result<size_t> Receive(std::span<RxDatagram> batch, std::chrono::nanoseconds timeout) override {
    if (batch.empty()) return size_t{0};
    if (HavePending()) return TakePending(batch);
    using Clock = std::chrono::steady_clock;
    // Timeouts beyond a day are treated as "wait until data or Wake()".
    const bool forever = timeout > std::chrono::hours(24);
    const Clock::time_point deadline =
        forever ? Clock::time_point::max() : Clock::now() + std::max(timeout, timeout.zero());
    if (timeout <= timeout.zero() || TryBeforeWaiting()) {
      const bool after_drain = !last_full_;
      bool got;
      if (group_fd_ >= 0 && after_drain) {
        // Two sockets, both likely empty: one ppoll names the readable one(s) where a recvmmsg
        // on each would be two system calls.
        static constexpr timespec kNow{};
        ASSIGN_OR_RETURN(Polled polled, PollThenReceive(&kNow, /*wakeable=*/false));
        got = polled == Polled::kData;
      } else {
        ASSIGN_OR_RETURN(got, ReceiveNow());
      }
      if (after_drain) hits_after_drain_ = got;
      if (got) return TakePending(batch);
      if (timeout <= timeout.zero()) return size_t{0};
    }
    for (;;) {
      timespec ts{};
      if (!forever) {
        const auto remaining = deadline - Clock::now();
        if (remaining <= remaining.zero()) return size_t{0};
        const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(remaining).count();
        ts.tv_sec = static_cast<time_t>(ns / 1000000000);
        ts.tv_nsec = static_cast<long>(ns % 1000000000);
      }
      ASSIGN_OR_RETURN(Polled polled, PollThenReceive(forever ? nullptr : &ts, /*wakeable=*/true));
      if (polled == Polled::kData) return TakePending(batch);
      if (polled == Polled::kNone) return size_t{0};
      // kAgain: readable, but only an error was queued: wait again.
    }
  }

  void Wake() override {
    const uint64_t one = 1;
    [[maybe_unused]] ssize_t ignored = ::write(wake_fd_, &one, sizeof one);
  }

  TransportCounters counters() const override {
    TransportCounters c = counts_.Snapshot();
    c.segmented_sends = segmented_sends_.Get();
    c.coalesced_receives = coalesced_receives_.Get();
    c.group_datagrams_received = group_received_.Get();
    return c;
  }

 private:
  // The most datagrams in one segmented send (the kernel's UDP_MAX_SEGMENTS is at least 64) and
  // the most bytes (an IPv4 datagram's payload).
  static constexpr size_t kMaxSegments = 64;
  static constexpr size_t kMaxSegmentedBytes = 65507;
  // A coalesced receive is at most 64 KiB; this many of them per recvmmsg.
  static constexpr size_t kMaxGroBytes = 65536;
  static constexpr size_t kGroMessages = 16;
  static constexpr size_t kControlBytes = 64;  // CMSG_SPACE of one int or uint16, with room
  static constexpr uint32_t kProbeEvery = 16;  // TryBeforeWaiting

  struct Control {
    alignas(cmsghdr) uint8_t bytes[kControlBytes];
  };

  // Fills tx_headers_ with up to max_batch_ messages for the front of batch: each message one
  // datagram, or (GSO) a run of consecutive datagrams to one destination with one length, as
  // iovecs (adjacent buffers merged). Records each message's datagram count in tx_counts_.
  size_t PrepareSend(std::span<const TxDatagram> batch) {
    size_t messages = 0, next = 0, iov = 0;
    while (messages < max_batch_ && next < batch.size()) {
      const TxDatagram& first = batch[next];
      const size_t len = first.data.size();
      size_t run = 1;
      if (gso_ && len > 0) {
        const size_t limit = std::min(kMaxSegments, kMaxSegmentedBytes / len);
        while (run < limit && next + run < batch.size() &&
               batch[next + run].destination == first.destination &&
               batch[next + run].data.size() == len) {
          ++run;
        }
      }
      iovec* const vecs = &tx_iovecs_[iov];
      size_t nvecs = 0;
      for (size_t k = 0; k < run; ++k) {
        const std::span<const uint8_t> d = batch[next + k].data;
        auto* base = const_cast<uint8_t*>(d.data());
        if (nvecs > 0 &&
            static_cast<uint8_t*>(vecs[nvecs - 1].iov_base) + vecs[nvecs - 1].iov_len == base) {
          vecs[nvecs - 1].iov_len += d.size();
        } else {
          vecs[nvecs++] = iovec{base, d.size()};
        }
      }
      iov += nvecs;
      tx_addresses_[messages] = ToSockaddr(first.destination);
      msghdr& h = tx_headers_[messages].msg_hdr;
      h = msghdr{};
      h.msg_name = &tx_addresses_[messages];
      h.msg_namelen = sizeof(sockaddr_in);
      h.msg_iov = vecs;
      h.msg_iovlen = nvecs;
      if (run > 1) {
        h.msg_control = tx_control_[messages].bytes;
        h.msg_controllen = CMSG_SPACE(sizeof(uint16_t));
        cmsghdr* c = CMSG_FIRSTHDR(&h);
        c->cmsg_level = SOL_UDP;
        c->cmsg_type = UDP_SEGMENT;
        c->cmsg_len = CMSG_LEN(sizeof(uint16_t));
        const auto segment = static_cast<uint16_t>(len);
        std::memcpy(CMSG_DATA(c), &segment, sizeof segment);
      }
      tx_headers_[messages].msg_len = 0;
      tx_counts_[messages] = run;
      ++messages;
      next += run;
    }
    return messages;
  }

  bool HavePending() const { return rx_message_ < rx_received_; }

  // Whether a Receive that may wait tries a nonblocking recvmmsg before ppoll. After a
  // recvmmsg that filled every message of its batch, more is likely queued: yes. After one that
  // drained the queue, a try costs a system call that mostly fails where data arrives in
  // bursts further apart than the caller's work on one (a worker: one GSO run of results per
  // wake-up, a recvmmsg that returns EAGAIN before every ppoll), and mostly succeeds where
  // senders keep the queue busy (the switch): so as long as the last such try found data, and
  // once in kProbeEvery waits otherwise (to notice when the traffic changed). Going to ppoll
  // first costs nothing when data is queued: ppoll returns at once.
  bool TryBeforeWaiting() {
    if (last_full_ || hits_after_drain_) return true;
    return ++waits_without_try_ % kProbeEvery == 0;
  }

  // What PollThenReceive found: datagrams now pending; nothing (the time passed, or Wake());
  // a socket that poll called readable but that had only an error to report.
  enum class Polled { kData, kNone, kAgain };

  // Waits in ppoll at most *timeout (nullptr: without limit) until a socket is readable (or,
  // if wakeable, Wake() was called: its eventfd is then reset), and reads the readable one(s).
  Result<Polled> PollThenReceive(const timespec* timeout, bool wakeable) {
    pollfd fds[3] = {{socket_fd_, POLLIN, 0}, {group_fd_, POLLIN, 0}, {wake_fd_, POLLIN, 0}};
    // (The group's entry is ignored by ppoll when there is no group: its fd is -1.)
    const int rc = ::ppoll(fds, wakeable ? 3 : 2, timeout, nullptr);
    if (rc < 0) {
      if (errno == EINTR) return Polled::kAgain;
      return InternalError("poll on UDP socket " + local_.ToString() +
                           " failed: " + ErrnoText(errno));
    }
    if (wakeable && (fds[2].revents & POLLIN)) {
      uint64_t value;
      // Resets the eventfd; a concurrent Wake() after this read stays pending for the next call.
      [[maybe_unused]] ssize_t ignored = ::read(wake_fd_, &value, sizeof value);
      return Polled::kNone;
    }
    const bool unicast = fds[0].revents != 0, group = group_fd_ >= 0 && fds[1].revents != 0;
    if (!unicast && !group) return Polled::kNone;
    ASSIGN_OR_RETURN(bool got, unicast&& group ? ReceiveNow()
                               : unicast       ? ReceiveNow(socket_fd_)
                                               : ReceiveNow(group_fd_));
    return got ? Polled::kData : Polled::kAgain;
  }

  // One nonblocking recvmmsg into the arena, from the socket or the loopback group's (taking
  // turns, so that neither waits behind the other); false when nothing is queued on either.
  Result<bool> ReceiveNow() {
    if (group_fd_ < 0) return ReceiveNow(socket_fd_);
    group_first_ = !group_first_;
    const int first = group_first_ ? group_fd_ : socket_fd_;
    const int second = group_first_ ? socket_fd_ : group_fd_;
    ASSIGN_OR_RETURN(bool got, ReceiveNow(first));
    if (got) return true;
    return ReceiveNow(second);
  }

  Result<bool> ReceiveNow(int fd) {
    for (size_t i = 0; i < rx_messages_; ++i) {
      rx_iovecs_[i] = iovec{rx_arena_.data() + i * rx_slot_bytes_, rx_slot_bytes_};
      msghdr& h = rx_headers_[i].msg_hdr;
      h = msghdr{};
      h.msg_name = &rx_addresses_[i];
      h.msg_namelen = sizeof(sockaddr_in);
      h.msg_iov = &rx_iovecs_[i];
      h.msg_iovlen = 1;
      if (gro_) {
        h.msg_control = rx_control_[i].bytes;
        h.msg_controllen = kControlBytes;
      }
      rx_headers_[i].msg_len = 0;
    }
    int r;
    // Pending ICMP errors of earlier sends surface here once each; skip past them.
    for (int attempt = 0;; ++attempt) {
      r = ::recvmmsg(fd, rx_headers_.data(), static_cast<unsigned>(rx_messages_), MSG_DONTWAIT,
                     nullptr);
      if (r >= 0) break;
      const int err = errno;
      if (err == EAGAIN || err == EWOULDBLOCK) {
        last_full_ = false;
        return false;
      }
      if ((err == EINTR || IsAsyncIcmpError(err)) && attempt < 16) continue;
      if (err == EINTR || IsAsyncIcmpError(err)) return false;
      return InternalError("UDP receive on " + local_.ToString() + " failed: " + ErrnoText(err));
    }
    if (r == 0) return false;
    counts_.receive_calls.Add(1);
    for (int i = 0; i < r; ++i) {
      const msghdr& h = rx_headers_[static_cast<size_t>(i)].msg_hdr;
      size_t segment = 0;  // 0: the message is one datagram
      if (gro_) {
        for (const cmsghdr* c = CMSG_FIRSTHDR(&h); c != nullptr;
             c = CMSG_NXTHDR(const_cast<msghdr*>(&h), const_cast<cmsghdr*>(c))) {
          if (c->cmsg_level == SOL_UDP && c->cmsg_type == UDP_GRO) {
            int value = 0;
            std::memcpy(&value, CMSG_DATA(c), sizeof value);
            if (value > 0) segment = static_cast<size_t>(value);
          }
        }
      }
      const size_t length = rx_headers_[static_cast<size_t>(i)].msg_len;
      if (segment >= length) segment = 0;
      if (segment > 0) coalesced_receives_.Add(1);
      rx_segment_[static_cast<size_t>(i)] = segment;
    }
    rx_received_ = static_cast<size_t>(r);
    last_full_ = rx_received_ == rx_messages_;
    rx_message_ = 0;
    rx_offset_ = 0;
    rx_from_group_ = fd == group_fd_;
    return true;
  }

  // Hands out datagrams of the last recvmmsg, splitting coalesced messages, from where the
  // previous call stopped.
  size_t TakePending(std::span<RxDatagram> batch) {
    size_t n = 0;
    uint64_t truncated = 0;
    while (n < batch.size() && rx_message_ < rx_received_) {
      const size_t m = rx_message_;
      const msghdr& h = rx_headers_[m].msg_hdr;
      const size_t length = rx_headers_[m].msg_len;
      const uint8_t* base = rx_arena_.data() + m * rx_slot_bytes_;
      const size_t segment = rx_segment_[m];
      const size_t len = segment == 0 ? length : std::min(segment, length - rx_offset_);
      RxDatagram& d = batch[n++];
      const bool cut = len > max_datagram_ || (h.msg_flags & MSG_TRUNC) != 0;
      d.data = {base + rx_offset_, std::min(len, max_datagram_)};
      d.truncated = cut;
      truncated += cut ? 1 : 0;
      const sockaddr_in& sin = rx_addresses_[m];
      if (h.msg_namelen >= sizeof(sockaddr_in) && sin.sin_family == AF_INET) {
        d.source = Endpoint{ntohl(sin.sin_addr.s_addr), ntohs(sin.sin_port)};
      } else {
        d.source = Endpoint{};
      }
      rx_offset_ += len;
      if (segment == 0 || rx_offset_ >= length) {
        ++rx_message_;
        rx_offset_ = 0;
      }
    }
    counts_.datagrams_received.Add(n);
    if (rx_from_group_) group_received_.Add(n);
    if (truncated > 0) counts_.truncated.Add(truncated);
    return n;
  }

  const int socket_fd_;
  const int wake_fd_;
  const Endpoint local_;
  const size_t max_batch_;
  const size_t max_datagram_;
  bool gso_;  // cleared if the kernel refuses a segmented send
  const bool gro_;
  // Send scratch: one entry per message of a sendmmsg.
  std::vector<mmsghdr> tx_headers_;
  std::vector<sockaddr_in> tx_addresses_;
  std::vector<Control> tx_control_;
  std::vector<iovec> tx_iovecs_;
  std::vector<size_t> tx_counts_;  // datagrams in each message
  // Receive arena: rx_messages_ slots of rx_slot_bytes_, and the state of the last recvmmsg.
  const size_t rx_slot_bytes_;
  const size_t rx_messages_;
  std::vector<uint8_t> rx_arena_;
  std::vector<mmsghdr> rx_headers_;
  std::vector<iovec> rx_iovecs_;
  std::vector<sockaddr_in> rx_addresses_;
  std::vector<Control> rx_control_;
  std::vector<size_t> rx_segment_;  // GRO segment size of each message, 0 = one datagram
  size_t rx_received_ = 0;          // messages the last recvmmsg returned
  size_t rx_message_ = 0;           // the next message to hand out
  size_t rx_offset_ = 0;            // the next datagram's offset in it
  // TryBeforeWaiting's state: the last recvmmsg filled its batch; the last try after a drained
  // queue found data; waits since one was tried.
  bool last_full_ = false;
  bool hits_after_drain_ = true;
  uint32_t waits_without_try_ = 0;
  const int socket_buffer_bytes_;
  int group_fd_ = -1;           // the multicast group's socket, if joined
  bool group_first_ = false;    // which socket the next ReceiveNow tries first
  bool rx_from_group_ = false;  // the last recvmmsg read the group's socket
  SingleWriterTransportCounters counts_;
  SingleWriterCounter segmented_sends_, coalesced_receives_, group_received_;
};

// Where and how far the socket's datagrams to multicast groups go (UdpOptions::multicast_ttl).
Status SetMulticastEgress(int fd, const TransportOptions& options, const std::string& address) {
  ip_mreqn via{};
  int ttl = 0, loop = 1;
  if (options.udp.multicast_ttl == 0) {
    via.imr_address.s_addr = htonl(INADDR_LOOPBACK);
  } else {
    constexpr uint32_t kLoopbackNet = 0x7f000000, kLoopbackMask = 0xff000000;
    if (options.udp.multicast_ttl < 0 || options.udp.multicast_ttl > 255) {
      return InvalidArgumentError("UDP transport on " + address + ": multicast_ttl " +
                                  std::to_string(options.udp.multicast_ttl) + " is not in 0..255");
    }
    if (options.bind_ipv4 == 0 || (options.bind_ipv4 & kLoopbackMask) == kLoopbackNet) {
      return InvalidArgumentError(
          "UDP transport on " + address +
          ": multicast to the LAN needs the address of the interface to send on, not " +
          Ipv4ToString(options.bind_ipv4) + " (bind to that interface's address)");
    }
    via.imr_address.s_addr = htonl(options.bind_ipv4);
    ttl = options.udp.multicast_ttl;
    loop = 0;
  }
  if (::setsockopt(fd, IPPROTO_IP, IP_MULTICAST_IF, &via, sizeof via) != 0 ||
      ::setsockopt(fd, IPPROTO_IP, IP_MULTICAST_TTL, &ttl, sizeof ttl) != 0 ||
      ::setsockopt(fd, IPPROTO_IP, IP_MULTICAST_LOOP, &loop, sizeof loop) != 0) {
    return UnavailableError(
        "UDP transport on " + address +
        ": cannot set the multicast interface, TTL or loop: " + ErrnoText(errno));
  }
  return Status();
}

// Opens one socket; *in_use tells the caller that the bind failed only because the port is taken.
Result<std::unique_ptr<Transport>> OpenUdpImpl(const TransportOptions& options, bool* in_use) {
  *in_use = false;
  const std::string address = Endpoint{options.bind_ipv4, options.port}.ToString();
  if (options.max_batch == 0) {
    return InvalidArgumentError("UDP transport on " + address + ": max_batch must be at least 1");
  }
  if (options.max_datagram_bytes == 0 || options.max_datagram_bytes > 65507) {
    return InvalidArgumentError("UDP transport on " + address +
                                ": max_datagram_bytes must be in 1..65507");
  }
  FileDescriptor sock(::socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (sock.get() < 0) {
    const int err = errno;
    std::string message = "cannot create a UDP socket for " + address + ": " + ErrnoText(err);
    if (err == EMFILE || err == ENFILE || err == ENOMEM || err == ENOBUFS) {
      return ResourceExhaustedError(message + "; close some files or raise the limit (ulimit -n)");
    }
    return UnavailableError(std::move(message));
  }
  if (options.udp.socket_buffer_bytes > 0) {
    SetBufferSize(sock.get(), SO_RCVBUFFORCE, SO_RCVBUF, options.udp.socket_buffer_bytes);
    SetBufferSize(sock.get(), SO_SNDBUFFORCE, SO_SNDBUF, options.udp.socket_buffer_bytes);
  }
  const sockaddr_in sin = ToSockaddr(Endpoint{options.bind_ipv4, options.port});
  if (::bind(sock.get(), reinterpret_cast<const sockaddr*>(&sin), sizeof sin) != 0) {
    const int err = errno;
    const std::string prefix = "cannot bind UDP socket to " + address + ": " + ErrnoText(err);
    switch (err) {
      case EADDRINUSE:
        *in_use = true;
        return UnavailableError(prefix +
                                "; another process (or another transport) holds this port: "
                                "stop it, choose another port, or use port 0 for an ephemeral one");
      case EADDRNOTAVAIL:
        return InvalidArgumentError(prefix + "; " + Ipv4ToString(options.bind_ipv4) +
                                    " is not an address of this host: use one of its "
                                    "interface addresses or 0.0.0.0");
      case EACCES:
        return FailedPreconditionError(prefix +
                                       "; ports below 1024 need root "
                                       "(CAP_NET_BIND_SERVICE): choose a port >= 1024");
      default:
        return UnavailableError(prefix);
    }
  }
  sockaddr_in bound{};
  socklen_t bound_len = sizeof bound;
  if (::getsockname(sock.get(), reinterpret_cast<sockaddr*>(&bound), &bound_len) != 0) {
    return InternalError("getsockname on UDP socket " + address + " failed: " + ErrnoText(errno));
  }
  FileDescriptor wake(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  if (wake.get() < 0) {
    return ResourceExhaustedError("cannot create an eventfd for UDP transport " + address + ": " +
                                  ErrnoText(errno));
  }
  const Endpoint local{options.bind_ipv4, ntohs(bound.sin_port)};
  // Multicast results (Transport::JoinGroup; docs/architecture.md, "Multicast results"): the
  // socket receives no group's datagrams merely because it is bound to the group's port
  // (IP_MULTICAST_ALL, on by default, would deliver every group that any socket of the host
  // joined). What it sends to a group: by default it never leaves the host (TTL 0) and goes out
  // on the loopback interface (the kernel's loop copy reaches this host's members); with
  // multicast_ttl > 0 it goes out on the interface holding the bound address with that TTL and
  // without a loop copy (no member on this host needs one: a local worker uses a loopback
  // group; the copy would cost a clone and a trip through the receive path per send).
  {
    const int all = 0;
    ::setsockopt(sock.get(), IPPROTO_IP, IP_MULTICAST_ALL, &all, sizeof all);
    RETURN_IF_ERROR(SetMulticastEgress(sock.get(), options, address));
  }
  // Offloads where the kernel has them: UDP_SEGMENT (Linux 4.18) is probed by setting the
  // socket's default segment size to 0 (no segmentation unless a send asks for it).
  const int zero = 0, one = 1;
  const bool gso =
      options.udp.gso && ::setsockopt(sock.get(), SOL_UDP, UDP_SEGMENT, &zero, sizeof zero) == 0;
  const bool gro =
      options.udp.gro && ::setsockopt(sock.get(), SOL_UDP, UDP_GRO, &one, sizeof one) == 0;
  if (options.udp.gso != gso || options.udp.gro != gro) {
    LOG(kInfo, kTransport) << "UDP " << address << ": kernel without "
                           << (options.udp.gso != gso ? "UDP_SEGMENT " : "")
                           << (options.udp.gro != gro ? "UDP_GRO " : "")
                           << "support; using plain batched I/O for it";
  }
  std::unique_ptr<Transport> transport =
      std::make_unique<UdpTransport>(sock.get(), wake.get(), local, options, gso, gro);
  sock.release();
  wake.release();
  return transport;
}

}  // namespace

Result<NetInterface> InterfaceToward(uint32_t destination, uint32_t source) {
  const std::string to = Ipv4ToString(destination);
  if (source == 0) {
    // A connected UDP socket sends nothing, but getsockname then names the routed source.
    FileDescriptor probe(::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
    if (probe.get() < 0) return UnavailableError("cannot create a socket: " + ErrnoText(errno));
    const sockaddr_in sin = ToSockaddr(Endpoint{destination, 9});
    if (::connect(probe.get(), reinterpret_cast<const sockaddr*>(&sin), sizeof sin) != 0) {
      return UnavailableError("no route to " + to + ": " + ErrnoText(errno));
    }
    sockaddr_in local{};
    socklen_t len = sizeof local;
    if (::getsockname(probe.get(), reinterpret_cast<sockaddr*>(&local), &len) != 0) {
      return InternalError("getsockname failed: " + ErrnoText(errno));
    }
    source = ntohl(local.sin_addr.s_addr);
  }
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return InternalError("getifaddrs failed: " + ErrnoText(errno));
  NetInterface found;
  for (ifaddrs* a = list; a != nullptr; a = a->ifa_next) {
    if (a->ifa_addr == nullptr || a->ifa_addr->sa_family != AF_INET) continue;
    const auto* in = reinterpret_cast<const sockaddr_in*>(a->ifa_addr);
    if (ntohl(in->sin_addr.s_addr) != source) continue;
    found.name = a->ifa_name;
    found.index = ::if_nametoindex(a->ifa_name);
    found.ipv4 = source;
    found.loopback = (a->ifa_flags & IFF_LOOPBACK) != 0;
    found.multicast = (a->ifa_flags & IFF_MULTICAST) != 0;
    break;
  }
  ::freeifaddrs(list);
  if (found.index == 0) {
    return NotFoundError("no interface of this host holds " + Ipv4ToString(source) +
                         " (the source address toward " + to + ")");
  }
  if (FileDescriptor probe(::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0)); probe.get() >= 0) {
    ifreq req{};
    std::strncpy(req.ifr_name, found.name.c_str(), IFNAMSIZ - 1);
    if (::ioctl(probe.get(), SIOCGIFMTU, &req) == 0 && req.ifr_mtu > 0) {
      found.mtu = static_cast<uint32_t>(req.ifr_mtu);
    }
  }
  return found;
}

Result<std::unique_ptr<Transport>> OpenUdp(const TransportOptions& options) {
  bool in_use = false;
  return OpenUdpImpl(options, &in_use);
}

Result<std::vector<std::unique_ptr<Transport>>> OpenUdpConsecutive(const TransportOptions& base,
                                                                   size_t count) {
  return OpenOnConsecutivePorts(base.port, count, "UDP", " on " + Ipv4ToString(base.bind_ipv4),
                                "free some ports", [&](uint16_t port, bool* in_use) {
                                  TransportOptions options = base;
                                  options.port = port;
                                  return OpenUdpImpl(options, in_use);
                                });
}

}  // namespace switchml::transport
