#include "control/listener.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "base/logging.h"

namespace switchml::control {
namespace {

// epoll data of the listening socket and of the wake-up eventfd (connections use their ids,
// which start at 1 and never reach these).
constexpr uint64_t kListenTag = 0;
constexpr uint64_t kWakeTag = UINT64_MAX;
// Connections accepted per wake-up at most, so that ended ones are seen between bursts.
constexpr int kAcceptBurst = 256;
// How long to pause accepting after an error that more tries would not cure at once.
constexpr int kBackoffMs = 100;

std::string ErrnoText(int err) { return std::string(std::strerror(err)); }

std::string PercentDecode(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '%' && i + 2 < s.size() && std::isxdigit(static_cast<unsigned char>(s[i + 1])) &&
        std::isxdigit(static_cast<unsigned char>(s[i + 2]))) {
      out.push_back(static_cast<char>(std::stoi(s.substr(i + 1, 2), nullptr, 16)));
      i += 2;
    } else {
      out.push_back(s[i]);
    }
  }
  return out;
}

// The normalized text of an address (IPv4-mapped IPv6 as IPv4).
std::optional<std::string> HostText(const std::string& text) {
  in_addr a4{};
  in6_addr a6{};
  char buf[INET6_ADDRSTRLEN];
  if (inet_pton(AF_INET, text.c_str(), &a4) == 1) {
    return std::string(inet_ntop(AF_INET, &a4, buf, sizeof buf));
  }
  if (inet_pton(AF_INET6, text.c_str(), &a6) == 1) {
    if (IN6_IS_ADDR_V4MAPPED(&a6)) {
      std::memcpy(&a4, a6.s6_addr + 12, 4);
      return std::string(inet_ntop(AF_INET, &a4, buf, sizeof buf));
    }
    return std::string(inet_ntop(AF_INET6, &a6, buf, sizeof buf));
  }
  return std::nullopt;
}

std::optional<PeerAddress> PeerOf(const sockaddr_storage& ss) {
  char buf[INET6_ADDRSTRLEN];
  if (ss.ss_family == AF_INET) {
    const auto* a = reinterpret_cast<const sockaddr_in*>(&ss);
    return PeerAddress{inet_ntop(AF_INET, &a->sin_addr, buf, sizeof buf), ntohs(a->sin_port)};
  }
  if (ss.ss_family == AF_INET6) {
    const auto* a = reinterpret_cast<const sockaddr_in6*>(&ss);
    auto host = HostText(inet_ntop(AF_INET6, &a->sin6_addr, buf, sizeof buf));
    if (!host) return std::nullopt;
    return PeerAddress{*host, ntohs(a->sin6_port)};
  }
  return std::nullopt;
}

// Closes an accepted socket with a reset (no TIME_WAIT here, and the client learns at once).
void Reject(int fd) {
  const linger l{1, 0};
  setsockopt(fd, SOL_SOCKET, SO_LINGER, &l, sizeof l);
  close(fd);
}

}  // namespace

std::optional<PeerAddress> ParsePeer(const std::string& grpc_peer) {
  const std::string peer = PercentDecode(grpc_peer);
  std::string rest;
  if (peer.rfind("ipv4:", 0) == 0 || peer.rfind("ipv6:", 0) == 0) {
    rest = peer.substr(5);
  } else {
    return std::nullopt;
  }
  const size_t colon = rest.rfind(':');
  if (colon == std::string::npos || colon == 0) return std::nullopt;
  std::string host = rest.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  if (const size_t zone = host.find('%'); zone != std::string::npos) host.resize(zone);
  const std::string port_text = rest.substr(colon + 1);
  if (port_text.empty() || port_text.size() > 5 ||
      port_text.find_first_not_of("0123456789") != std::string::npos) {
    return std::nullopt;
  }
  const unsigned long port = std::stoul(port_text);
  if (port > 65535) return std::nullopt;
  auto normalized = HostText(host);
  if (!normalized) return std::nullopt;
  return PeerAddress{*normalized, static_cast<uint16_t>(port)};
}

// ---------------------------------------------------------------------------------------------
// ConnectionTable

ConnectionTable::Decision ConnectionTable::Add(uint64_t id, const PeerAddress& peer) {
  std::optional<uint64_t> evict;
  {
    const Host& h = hosts_[peer.host];
    if (h.count >= limits_.per_address) {
      if (h.unused.empty()) {
        if (h.count == 0) hosts_.erase(peer.host);
        return {};
      }
      evict = h.unused.front();
    } else if (connections_.size() >= limits_.total) {
      if (unused_.empty()) {
        if (h.count == 0) hosts_.erase(peer.host);
        return {};
      }
      evict = unused_.front();
    }
  }
  if (evict) Remove(*evict);
  Host& h = hosts_[peer.host];
  ++h.count;
  Connection c;
  c.peer = peer;
  c.unused_pos = unused_.insert(unused_.end(), id);
  c.unused_of_host_pos = h.unused.insert(h.unused.end(), id);
  connections_[id] = std::move(c);
  by_peer_[{peer.host, peer.port}] = id;
  return {true, evict};
}

void ConnectionTable::Unlist(uint64_t id, Connection& c) {
  (void)id;
  if (c.used) return;
  unused_.erase(c.unused_pos);
  hosts_.at(c.peer.host).unused.erase(c.unused_of_host_pos);
}

void ConnectionTable::MarkUsed(const PeerAddress& peer) {
  auto p = by_peer_.find({peer.host, peer.port});
  if (p == by_peer_.end()) return;
  Connection& c = connections_.at(p->second);
  if (c.used) return;
  Unlist(p->second, c);
  c.used = true;
}

void ConnectionTable::Remove(uint64_t id) {
  auto it = connections_.find(id);
  if (it == connections_.end()) return;
  Connection& c = it->second;
  Unlist(id, c);
  auto h = hosts_.find(c.peer.host);
  if (--h->second.count == 0) hosts_.erase(h);
  if (auto p = by_peer_.find({c.peer.host, c.peer.port}); p != by_peer_.end() && p->second == id) {
    by_peer_.erase(p);
  }
  connections_.erase(it);
}

size_t ConnectionTable::size_of(const std::string& host) const {
  auto it = hosts_.find(host);
  return it == hosts_.end() ? 0 : it->second.count;
}

bool ConnectionTable::used(uint64_t id) const {
  auto it = connections_.find(id);
  return it != connections_.end() && it->second.used;
}

// ---------------------------------------------------------------------------------------------
// Listener

Result<std::unique_ptr<Listener>> Listener::Bind(const ListenerOptions& options) {
  // Every address, as gRPC listens for "0.0.0.0" and "::": one IPv6 socket that takes IPv4 too
  // where the host has IPv6, else an IPv4 one.
  const bool wildcard = options.bind_address.empty() || options.bind_address == "0.0.0.0" ||
                        options.bind_address == "::" || options.bind_address == "[::]";
  std::vector<sockaddr_storage> candidates;
  if (wildcard) {
    sockaddr_storage s6{}, s4{};
    auto* a6 = reinterpret_cast<sockaddr_in6*>(&s6);
    a6->sin6_family = AF_INET6;
    a6->sin6_addr = in6addr_any;
    a6->sin6_port = htons(options.port);
    auto* a4 = reinterpret_cast<sockaddr_in*>(&s4);
    a4->sin_family = AF_INET;
    a4->sin_addr.s_addr = htonl(INADDR_ANY);
    a4->sin_port = htons(options.port);
    candidates = {s6, s4};
  } else {
    std::string host = options.bind_address;
    if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
      host = host.substr(1, host.size() - 2);
    }
    addrinfo hints{};
    hints.ai_flags = AI_PASSIVE;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* res = nullptr;
    const std::string port = std::to_string(options.port);
    if (const int rc = getaddrinfo(host.c_str(), port.c_str(), &hints, &res); rc != 0) {
      return InvalidArgumentError("cannot resolve the control plane's bind address '" +
                                  options.bind_address + "': " + gai_strerror(rc));
    }
    for (addrinfo* r = res; r != nullptr; r = r->ai_next) {
      sockaddr_storage s{};
      std::memcpy(&s, r->ai_addr, r->ai_addrlen);
      candidates.push_back(s);
    }
    freeaddrinfo(res);
  }
  int last_err = 0;
  for (const sockaddr_storage& s : candidates) {
    const int fd = socket(s.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      last_err = errno;
      continue;
    }
    const int one = 1, zero = 0;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (s.ss_family == AF_INET6 && wildcard) {
      setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
    }
    const socklen_t len = s.ss_family == AF_INET6 ? sizeof(sockaddr_in6)
                                                  : static_cast<socklen_t>(sizeof(sockaddr_in));
    if (bind(fd, reinterpret_cast<const sockaddr*>(&s), len) != 0 || listen(fd, SOMAXCONN) != 0) {
      last_err = errno;
      close(fd);
      if (last_err == EADDRINUSE) break;  // taken: another address family would not help
      continue;
    }
    sockaddr_storage bound{};
    socklen_t bound_len = sizeof bound;
    getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &bound_len);
    const uint16_t port =
        ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                          : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
    return std::unique_ptr<Listener>(new Listener(fd, port, options.limits));
  }
  return UnavailableError("cannot listen on " + options.bind_address + " port " +
                          std::to_string(options.port) + ": " + ErrnoText(last_err));
}

Listener::Listener(int listen_fd, uint16_t port, const ConnectionLimits& limits)
    : listen_fd_(listen_fd), port_(port), table_(limits) {}

Listener::~Listener() {
  Stop();
  close(listen_fd_);
}

void Listener::Start(Handoff handoff) {
  handoff_ = std::move(handoff);
  epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
  wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  spare_fd_ = open("/dev/null", O_RDONLY | O_CLOEXEC);
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = kListenTag;
  epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, listen_fd_, &ev);
  ev.data.u64 = kWakeTag;
  epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, wake_fd_, &ev);
  thread_ = std::thread([this] { Run(); });
}

void Listener::Stop() {
  {
    std::lock_guard lock(mu_);
    if (stopped_) return;
    stopped_ = true;
  }
  if (thread_.joinable()) {
    const uint64_t one = 1;
    (void)!write(wake_fd_, &one, sizeof one);
    thread_.join();
  }
  std::lock_guard lock(mu_);
  for (const auto& [id, fd] : watch_fds_) close(fd);
  watch_fds_.clear();
  for (int* fd : {&epoll_fd_, &wake_fd_, &spare_fd_}) {
    if (*fd >= 0) close(*fd);
    *fd = -1;
  }
}

void Listener::MarkUsed(const std::string& grpc_peer) {
  auto peer = ParsePeer(grpc_peer);
  if (!peer) return;
  std::lock_guard lock(mu_);
  table_.MarkUsed(*peer);
}

Listener::Stats Listener::stats() const {
  std::lock_guard lock(mu_);
  Stats s = stats_;
  s.open = table_.size();
  return s;
}

void Listener::Run() {
  std::vector<epoll_event> events(128);
  bool backoff = false;
  while (true) {
    const int n = epoll_wait(epoll_fd_, events.data(), static_cast<int>(events.size()),
                             backoff ? kBackoffMs : -1);
    if (backoff) {
      // Accept again (a level-triggered listening socket that still has connections waiting is
      // reported at once).
      epoll_event ev{};
      ev.events = EPOLLIN;
      ev.data.u64 = kListenTag;
      epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, listen_fd_, &ev);
      backoff = false;
    }
    for (int i = 0; i < n; ++i) {
      const uint64_t tag = events[i].data.u64;
      if (tag == kWakeTag) return;
      if (tag == kListenTag) {
        for (int k = 0; k < kAcceptBurst; ++k) {
          sockaddr_storage ss{};
          socklen_t len = sizeof ss;
          const int fd = accept4(listen_fd_, reinterpret_cast<sockaddr*>(&ss), &len,
                                 SOCK_NONBLOCK | SOCK_CLOEXEC);
          if (fd < 0) {
            const int err = errno;
            if (err == EAGAIN || err == EWOULDBLOCK) break;
            if (err == EINTR || err == ECONNABORTED || err == EPROTO) continue;
            if ((err == EMFILE || err == ENFILE)) {
              if (Shed()) continue;  // the next one may fit again (or is shed too)
            } else {
              LOG(kWarning, kControl) << "control plane: accept failed: " << ErrnoText(err)
                                      << "; accepting again in " << kBackoffMs << " ms";
            }
            // Pause accepting: the listening socket out of the set until the timeout.
            epoll_event ev{};
            ev.events = 0;
            ev.data.u64 = kListenTag;
            epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, listen_fd_, &ev);
            backoff = true;
            break;
          }
          Admit(fd, ss);
        }
        continue;
      }
      Ended(tag);
    }
  }
}

void Listener::Admit(int fd, const sockaddr_storage& ss) {
  const std::optional<PeerAddress> peer = PeerOf(ss);
  if (!peer) {
    Reject(fd);
    return;
  }
  const int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  uint64_t id;
  {
    std::lock_guard lock(mu_);
    id = next_id_++;
    const ConnectionTable::Decision d = table_.Add(id, *peer);
    if (!d.admit) {
      ++stats_.refused;
      Reject(fd);
      return;
    }
    if (d.evict) {
      ++stats_.evicted;
      // Ends the connection for gRPC too (the socket is shared: gRPC sees it end and closes its
      // descriptor); ours is closed at once, so that a burst does not pile descriptors up.
      if (auto w = watch_fds_.find(*d.evict); w != watch_fds_.end()) {
        shutdown(w->second, SHUT_RDWR);
        epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, w->second, nullptr);
        close(w->second);
        watch_fds_.erase(w);
      }
    }
    // Our copy, to see the connection end (gRPC shuts a connection down before it closes it).
    const int watch = fcntl(fd, F_DUPFD_CLOEXEC, 0);
    epoll_event ev{};
    ev.events = EPOLLRDHUP;
    ev.data.u64 = id;
    if (watch < 0 || epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, watch, &ev) != 0) {
      if (watch >= 0) close(watch);
      table_.Remove(id);
      ++stats_.refused;
      Reject(fd);
      return;
    }
    watch_fds_[id] = watch;
    ++stats_.accepted;
  }
  handoff_(fd);
}

bool Listener::Shed() {
  // Out of descriptors: give up the spare for a moment to take the connection at the head of
  // the queue and close it, so that the queue moves and its client learns at once.
  std::lock_guard lock(mu_);
  if (spare_fd_ >= 0) {
    close(spare_fd_);
    spare_fd_ = -1;
  }
  const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
  if (fd >= 0) {
    Reject(fd);
    ++stats_.shed;
  }
  spare_fd_ = open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  if (stats_.shed == 1 || stats_.shed % 1000 == 0) {
    LOG(kWarning, kControl) << "control plane: out of file descriptors; " << stats_.shed
                            << " connection(s) closed unread so far (raise the open-file limit: "
                               "ulimit -n)";
  }
  return true;
}

void Listener::Ended(uint64_t id) {
  std::lock_guard lock(mu_);
  auto w = watch_fds_.find(id);
  if (w != watch_fds_.end()) {
    epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, w->second, nullptr);
    close(w->second);
    watch_fds_.erase(w);
  }
  table_.Remove(id);
}

uint64_t RaiseOpenFileLimit() {
  rlimit r{};
  if (getrlimit(RLIMIT_NOFILE, &r) != 0) return 0;
  if (r.rlim_cur < r.rlim_max) {
    const rlim_t before = r.rlim_cur;
    r.rlim_cur = r.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &r) == 0) {
      LOG(kDebug, kControl) << "open-file limit raised from " << before << " to " << r.rlim_cur;
    } else {
      getrlimit(RLIMIT_NOFILE, &r);
    }
  }
  return r.rlim_cur;
}

}  // namespace switchml::control
