#include "transport/udp.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
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

// The UDP transport. Owns the socket and the eventfd. Scratch arrays for the syscalls are sized
// once (max_batch) so the packet path does not allocate.
class UdpTransport final : public Transport {
 public:
  UdpTransport(int socket_fd, int wake_fd, Endpoint local, size_t max_batch)
      : socket_fd_(socket_fd),
        wake_fd_(wake_fd),
        local_(local),
        max_batch_(max_batch),
        headers_(max_batch),
        iovecs_(max_batch),
        addresses_(max_batch) {}
  ~UdpTransport() override {
    ::close(socket_fd_);
    ::close(wake_fd_);
  }

  Endpoint local_endpoint() const override { return local_; }

  Result<size_t> Send(std::span<const TxDatagram> batch) override {
    size_t taken = 0;
    while (taken < batch.size()) {
      const size_t n = std::min(batch.size() - taken, max_batch_);
      for (size_t i = 0; i < n; ++i) {
        const TxDatagram& d = batch[taken + i];
        addresses_[i] = ToSockaddr(d.destination);
        PrepareHeader(i, const_cast<uint8_t*>(d.data.data()), d.data.size());
      }
      const int r = ::sendmmsg(socket_fd_, headers_.data(), static_cast<unsigned>(n), 0);
      if (r > 0) {
        // A short count means datagram taken + r failed; the next call reports its error.
        taken += static_cast<size_t>(r);
        datagrams_sent_.fetch_add(static_cast<uint64_t>(r), std::memory_order_relaxed);
        continue;
      }
      const int err = r < 0 ? errno : EAGAIN;
      if (err == EINTR) continue;
      if (err == EAGAIN || err == EWOULDBLOCK || err == ENOBUFS) {
        send_buffer_full_.fetch_add(1, std::memory_order_relaxed);
        break;
      }
      if (IsPerDatagramSendError(err)) {
        send_errors_.fetch_add(1, std::memory_order_relaxed);
        ++taken;  // skip the datagram that failed
        continue;
      }
      return UnavailableError("UDP send from " + local_.ToString() + " failed: " + ErrnoText(err));
    }
    return taken;
  }

  Result<size_t> Receive(std::span<RxDatagram> batch, std::chrono::nanoseconds timeout) override {
    if (batch.empty()) return size_t{0};
    using Clock = std::chrono::steady_clock;
    // Timeouts beyond a day are treated as "wait until data or Wake()".
    const bool forever = timeout > std::chrono::hours(24);
    const Clock::time_point deadline =
        forever ? Clock::time_point::max() : Clock::now() + std::max(timeout, timeout.zero());
    for (;;) {
      ASSIGN_OR_RETURN(size_t got, ReceiveNow(batch));
      if (got > 0) return got;
      if (timeout <= timeout.zero()) return size_t{0};
      timespec ts{};
      if (!forever) {
        const auto remaining = deadline - Clock::now();
        if (remaining <= remaining.zero()) return size_t{0};
        const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(remaining).count();
        ts.tv_sec = static_cast<time_t>(ns / 1000000000);
        ts.tv_nsec = static_cast<long>(ns % 1000000000);
      }
      pollfd fds[2] = {{socket_fd_, POLLIN, 0}, {wake_fd_, POLLIN, 0}};
      const int rc = ::ppoll(fds, 2, forever ? nullptr : &ts, nullptr);
      if (rc < 0) {
        if (errno == EINTR) continue;
        return InternalError("poll on UDP socket " + local_.ToString() +
                             " failed: " + ErrnoText(errno));
      }
      if (fds[1].revents & POLLIN) {
        uint64_t value;
        // Resets the eventfd; a concurrent Wake() after this read stays pending for the next call.
        [[maybe_unused]] ssize_t ignored = ::read(wake_fd_, &value, sizeof value);
        return size_t{0};
      }
      if (rc == 0) return size_t{0};
      // The socket is readable (or reported an error): try again.
    }
  }

  void Wake() override {
    const uint64_t one = 1;
    [[maybe_unused]] ssize_t ignored = ::write(wake_fd_, &one, sizeof one);
  }

  UdpCounters counters() const {
    UdpCounters c;
    c.datagrams_sent = datagrams_sent_.load(std::memory_order_relaxed);
    c.datagrams_received = datagrams_received_.load(std::memory_order_relaxed);
    c.send_errors = send_errors_.load(std::memory_order_relaxed);
    c.truncated = truncated_.load(std::memory_order_relaxed);
    c.send_buffer_full = send_buffer_full_.load(std::memory_order_relaxed);
    return c;
  }

 private:
  // Points batch entry i (its mmsghdr, iovec and address slot) at one datagram buffer.
  void PrepareHeader(size_t i, uint8_t* data, size_t length) {
    iovecs_[i].iov_base = data;
    iovecs_[i].iov_len = length;
    msghdr& h = headers_[i].msg_hdr;
    h = msghdr{};
    h.msg_name = &addresses_[i];
    h.msg_namelen = sizeof(sockaddr_in);
    h.msg_iov = &iovecs_[i];
    h.msg_iovlen = 1;
    headers_[i].msg_len = 0;
  }

  // One nonblocking recvmmsg; 0 when nothing is queued.
  Result<size_t> ReceiveNow(std::span<RxDatagram> batch) {
    const size_t n = std::min(batch.size(), max_batch_);
    for (size_t i = 0; i < n; ++i) PrepareHeader(i, batch[i].buffer.data(), batch[i].buffer.size());
    int r;
    // Pending ICMP errors of earlier sends surface here once each; skip past them.
    for (int attempt = 0;; ++attempt) {
      r = ::recvmmsg(socket_fd_, headers_.data(), static_cast<unsigned>(n), MSG_DONTWAIT, nullptr);
      if (r >= 0) break;
      const int err = errno;
      if (err == EAGAIN || err == EWOULDBLOCK) return size_t{0};
      if ((err == EINTR || IsAsyncIcmpError(err)) && attempt < 16) continue;
      if (err == EINTR || IsAsyncIcmpError(err)) return size_t{0};
      return InternalError("UDP receive on " + local_.ToString() + " failed: " + ErrnoText(err));
    }
    uint64_t truncated = 0;
    for (int i = 0; i < r; ++i) {
      RxDatagram& d = batch[static_cast<size_t>(i)];
      const msghdr& h = headers_[static_cast<size_t>(i)].msg_hdr;
      d.length = headers_[static_cast<size_t>(i)].msg_len;
      d.truncated = (h.msg_flags & MSG_TRUNC) != 0;
      truncated += d.truncated ? 1 : 0;
      const sockaddr_in& sin = addresses_[static_cast<size_t>(i)];
      if (h.msg_namelen >= sizeof(sockaddr_in) && sin.sin_family == AF_INET) {
        d.source = Endpoint{ntohl(sin.sin_addr.s_addr), ntohs(sin.sin_port)};
      } else {
        d.source = Endpoint{};
      }
    }
    datagrams_received_.fetch_add(static_cast<uint64_t>(r), std::memory_order_relaxed);
    if (truncated > 0) truncated_.fetch_add(truncated, std::memory_order_relaxed);
    return static_cast<size_t>(r);
  }

  const int socket_fd_;
  const int wake_fd_;
  const Endpoint local_;
  const size_t max_batch_;
  std::vector<mmsghdr> headers_;
  std::vector<iovec> iovecs_;
  std::vector<sockaddr_in> addresses_;
  std::atomic<uint64_t> datagrams_sent_{0};
  std::atomic<uint64_t> datagrams_received_{0};
  std::atomic<uint64_t> send_errors_{0};
  std::atomic<uint64_t> truncated_{0};
  std::atomic<uint64_t> send_buffer_full_{0};
};

// Sets a socket buffer size, trying the privileged *FORCE variant first (it ignores the
// rmem_max/wmem_max limits when we run as root) and falling back silently.
void SetBufferSize(int fd, int force_option, int option, int bytes) {
  if (::setsockopt(fd, SOL_SOCKET, force_option, &bytes, sizeof bytes) == 0) return;
  if (::setsockopt(fd, SOL_SOCKET, option, &bytes, sizeof bytes) != 0) {
    LOG(kDebug, kTransport) << "setsockopt buffer size " << bytes
                            << " failed: " << ErrnoText(errno);
  }
}

// Opens one socket; *in_use tells the caller that the bind failed only because the port is taken.
Result<std::unique_ptr<Transport>> OpenUdpImpl(const UdpOptions& options, bool* in_use) {
  *in_use = false;
  const std::string address = Endpoint{options.bind_ipv4, options.port}.ToString();
  if (options.max_batch == 0) {
    return InvalidArgumentError("UDP transport on " + address + ": max_batch must be at least 1");
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
  if (options.socket_buffer_bytes > 0) {
    SetBufferSize(sock.get(), SO_RCVBUFFORCE, SO_RCVBUF, options.socket_buffer_bytes);
    SetBufferSize(sock.get(), SO_SNDBUFFORCE, SO_SNDBUF, options.socket_buffer_bytes);
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
  std::unique_ptr<Transport> transport =
      std::make_unique<UdpTransport>(sock.get(), wake.get(), local, options.max_batch);
  sock.release();
  wake.release();
  return transport;
}

}  // namespace

Result<std::unique_ptr<Transport>> OpenUdp(const UdpOptions& options) {
  bool in_use = false;
  return OpenUdpImpl(options, &in_use);
}

Result<std::vector<std::unique_ptr<Transport>>> OpenUdpConsecutive(const UdpOptions& base,
                                                                   size_t count) {
  constexpr uint32_t kRandomBaseLow = 20000;
  constexpr uint32_t kRandomBaseHigh = 32000;  // exclusive; stays below Linux's ephemeral range
  constexpr int kMaxTries = 200;
  if (count == 0) return InvalidArgumentError("OpenUdpConsecutive: count must be at least 1");
  const uint32_t first_base = base.port != 0 ? base.port : kRandomBaseLow;
  if (first_base + count - 1 > 65535) {
    return InvalidArgumentError("cannot open " + std::to_string(count) +
                                " consecutive UDP ports from " + std::to_string(first_base) +
                                ": the range passes 65535; choose a lower base port");
  }
  auto open_range = [&](uint16_t start,
                        bool* in_use) -> Result<std::vector<std::unique_ptr<Transport>>> {
    std::vector<std::unique_ptr<Transport>> transports;
    transports.reserve(count);
    for (size_t i = 0; i < count; ++i) {
      UdpOptions options = base;
      options.port = static_cast<uint16_t>(start + i);
      ASSIGN_OR_RETURN(std::unique_ptr<Transport> t, OpenUdpImpl(options, in_use));
      transports.push_back(std::move(t));
    }
    return transports;
  };
  bool in_use = false;
  if (base.port != 0) return open_range(base.port, &in_use);

  std::mt19937 rng(std::random_device{}());
  std::uniform_int_distribution<uint32_t> pick(kRandomBaseLow, kRandomBaseHigh - 1);
  for (int attempt = 0; attempt < kMaxTries; ++attempt) {
    const uint32_t start = pick(rng);
    if (start + count - 1 > 65535) continue;
    auto result = open_range(static_cast<uint16_t>(start), &in_use);
    if (result.ok() || !in_use) return result;
  }
  return UnavailableError("could not find " + std::to_string(count) +
                          " consecutive free UDP ports on " + Ipv4ToString(base.bind_ipv4) +
                          " with a base in [20000, 32000) after " + std::to_string(kMaxTries) +
                          " tries; free some ports or give an explicit base port");
}

bool GetUdpCounters(const Transport& transport, UdpCounters* out) {
  const auto* udp = dynamic_cast<const UdpTransport*>(&transport);
  if (udp == nullptr) return false;
  *out = udp->counters();
  return true;
}

}  // namespace switchml::transport
