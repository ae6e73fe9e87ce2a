#include "runtime/switch_daemon.h"

#include <array>
#include <sstream>
#include <vector>

#include "base/endpoint.h"
#include "base/logging.h"
#include "base/status_macros.h"
#include "proto/wire.h"
#include "transport/factory.h"

namespace switchml::runtime {
namespace {
// Datagrams per receive; each may produce one reply in a transmit buffer of its own.
constexpr size_t kBatch = 256;
static_assert(kBatch <= transport::Transport::kTxBuffers);
// Destinations remembered for grouping; the table starts over when it holds more.
constexpr size_t kMaxBuckets = 4096;
}  // namespace

Status SwitchDaemonOptions::Validate() const {
  uint32_t ip;
  if (!ParseIpv4(bind_address, &ip)) {
    return InvalidArgumentError("bind address '" + bind_address +
                                "' is not an IPv4 address (use 0.0.0.0 for all)");
  }
  if (!(loss >= 0 && loss < 1)) {
    return InvalidArgumentError("loss must be in [0, 1), e.g. 0.01 for 1%");
  }
  transport::TransportOptions t;
  t.kind = transport;
  RETURN_IF_ERROR(t.Validate());
  return switch_config.Validate();
}

SwitchDaemon::SwitchDaemon(const SwitchDaemonOptions& options)
    : options_(options),
      switch_(std::make_unique<dataplane::LockedSwitch>(options.switch_config)) {
  const size_t max_tx = kBatch * options.switch_config.max_workers_per_job;
  tx_.reserve(max_tx);
  sorted_.resize(max_tx);
  tx_bucket_.resize(max_tx);
  bucket_start_.reserve(kMaxBuckets + 1);
}

Result<std::unique_ptr<SwitchDaemon>> SwitchDaemon::Start(const SwitchDaemonOptions& options) {
  RETURN_IF_ERROR(options.Validate());
  std::unique_ptr<SwitchDaemon> d(new SwitchDaemon(options));
  transport::TransportOptions topts;
  topts.kind = options.transport;
  ParseIpv4(options.bind_address, &topts.bind_ipv4);
  topts.port = options.data_port;
  topts.max_datagram_bytes = proto::kMaxDatagramBytes;
  topts.socket_buffer_bytes = 16 << 20;  // room for every worker's window at once
  topts.loss = options.loss;
  topts.loss_seed = options.seed;
  auto t = transport::OpenTransport(topts);
  if (!t.ok()) {
    return Status(t.status().code(), "data port: " + t.status().message());
  }
  d->transport_ = std::move(t).value();
  d->data_port_ = d->transport_->local_endpoint().port;
  LOG(kInfo, kDataplane) << "data plane on " << d->transport_->local_endpoint().ToString()
                         << " over " << d->transport_->name();
  control::ControlServerOptions copts;
  copts.bind_address = options.bind_address;
  copts.port = options.control_port;
  copts.data_port = d->data_port_;
  copts.switch_ipv4 = topts.bind_ipv4;
  auto c = control::ControlServer::Start(copts, d->switch_.get());
  if (!c.ok()) return c.status();
  d->control_ = std::move(c).value();
  d->thread_ = std::thread([p = d.get()] { p->Run(); });
  return d;
}

SwitchDaemon::~SwitchDaemon() { Stop(); }

void SwitchDaemon::Stop() {
  if (stop_.exchange(true)) return;
  if (control_) control_->Shutdown();
  if (transport_) transport_->Wake();
  if (thread_.joinable()) thread_.join();
}

void SwitchDaemon::GroupByDestination() {
  // A counting sort over destination buckets: two passes, no allocation once the bucket table
  // has seen every destination.
  if (buckets_.size() > kMaxBuckets) buckets_.clear();
  for (size_t i = 0; i < tx_.size(); ++i) {
    auto [it, inserted] =
        buckets_.try_emplace(tx_[i].destination, static_cast<uint32_t>(buckets_.size()));
    tx_bucket_[i] = it->second;
  }
  bucket_start_.assign(buckets_.size() + 1, 0);
  for (size_t i = 0; i < tx_.size(); ++i) ++bucket_start_[tx_bucket_[i] + 1];
  for (size_t b = 1; b < bucket_start_.size(); ++b) bucket_start_[b] += bucket_start_[b - 1];
  for (size_t i = 0; i < tx_.size(); ++i) sorted_[bucket_start_[tx_bucket_[i]]++] = tx_[i];
}

void SwitchDaemon::Run() {
  std::array<transport::RxDatagram, kBatch> rx;
  const auto wait = options_.busy_poll ? std::chrono::milliseconds(0)
                                       : std::chrono::milliseconds(200);
  while (!stop_.load(std::memory_order_relaxed)) {
    auto r = transport_->Receive(rx, wait);
    if (!r.ok()) {
      LOG(kError, kDataplane) << "receive failed: " << r.status().ToString();
      std::this_thread::sleep_for(std::chrono::milliseconds(10));  // do not spin on a hard error
      continue;
    }
    if (*r == 0) continue;
    received_.fetch_add(*r, std::memory_order_relaxed);
    tx_.clear();
    size_t replies = 0;
    {
      std::lock_guard<std::mutex> lock(switch_->mu);
      for (size_t i = 0; i < *r; ++i) {
        if (rx[i].truncated) {  // longer than any SwitchML packet: not ours
          truncated_.fetch_add(1, std::memory_order_relaxed);
          continue;
        }
        const std::span<uint8_t> reply = transport_->TxBuffer(replies);
        const dataplane::Action& a = switch_->sw.Process(rx[i].source, rx[i].data);
        if (a.kind == dataplane::Action::Kind::kDrop) continue;
        std::copy(a.reply.begin(), a.reply.end(), reply.begin());
        ++replies;
        for (const Endpoint& dst : a.destinations) {
          tx_.push_back({dst, reply.first(a.reply.size())});
        }
      }
    }
    GroupByDestination();
    size_t done = 0;
    const std::span<const transport::TxDatagram> out(sorted_.data(), tx_.size());
    for (int attempt = 0; done < out.size() && attempt < 1000; ++attempt) {
      auto s = transport_->Send(out.subspan(done));
      if (!s.ok()) {
        LOG(kError, kDataplane) << "send failed: " << s.status().ToString();
        break;
      }
      done += *s;
      if (done < out.size()) std::this_thread::yield();
    }
    sent_.fetch_add(done, std::memory_order_relaxed);
  }
}

DaemonCounters SwitchDaemon::counters() const {
  const transport::TransportCounters t = transport_->counters();
  DaemonCounters c;
  c.received = received_.load(std::memory_order_relaxed);
  c.sent = sent_.load(std::memory_order_relaxed);
  c.loss_dropped_in = t.loss_dropped_in;
  c.loss_dropped_out = t.loss_dropped_out;
  c.truncated = truncated_.load(std::memory_order_relaxed);
  c.receive_calls = t.receive_calls;
  c.send_calls = t.send_calls;
  c.coalesced_receives = t.coalesced_receives;
  c.segmented_sends = t.segmented_sends;
  return c;
}

std::string SwitchDaemon::FormatCounters(bool per_slot) {
  const DaemonCounters c = counters();
  std::ostringstream out;
  out << "daemon: received " << c.received << ", sent " << c.sent << " over "
      << transport_->name() << " (" << c.receive_calls << " receive calls, " << c.send_calls
      << " send calls, " << c.coalesced_receives << " coalesced receives, " << c.segmented_sends
      << " segmented sends)";
  if (options_.loss > 0) {
    out << ", loss-simulator dropped " << c.loss_dropped_in << " in and " << c.loss_dropped_out
        << " out";
  }
  if (c.truncated > 0) out << ", oversized " << c.truncated;
  out << "\n";
  std::lock_guard<std::mutex> lock(switch_->mu);
  out << switch_->sw.FormatCounters(per_slot);
  return out.str();
}

}  // namespace switchml::runtime
