#include "runtime/switch_daemon.h"

#include <array>
#include <sstream>
#include <vector>

#include "base/endpoint.h"
#include "base/logging.h"
#include "proto/wire.h"
#include "transport/udp.h"

namespace switchml::runtime {
namespace {
constexpr size_t kBatch = 64;
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
  return switch_config.Validate();
}

SwitchDaemon::SwitchDaemon(const SwitchDaemonOptions& options)
    : options_(options),
      switch_(std::make_unique<dataplane::LockedSwitch>(options.switch_config)),
      rng_(options.seed) {}

Result<std::unique_ptr<SwitchDaemon>> SwitchDaemon::Start(const SwitchDaemonOptions& options) {
  RETURN_IF_ERROR(options.Validate());
  std::unique_ptr<SwitchDaemon> d(new SwitchDaemon(options));
  transport::UdpOptions udp;
  ParseIpv4(options.bind_address, &udp.bind_ipv4);
  udp.port = options.data_port;
  udp.max_batch = kBatch;
  auto t = transport::OpenUdp(udp);
  if (!t.ok()) {
    return Status(t.status().code(), "data port: " + t.status().message());
  }
  d->transport_ = std::move(t).value();
  d->data_port_ = d->transport_->local_endpoint().port;
  control::ControlServerOptions copts;
  copts.bind_address = options.bind_address;
  copts.port = options.control_port;
  copts.data_port = d->data_port_;
  copts.switch_ipv4 = udp.bind_ipv4;
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

void SwitchDaemon::Run() {
  std::vector<uint8_t> rx_bufs(kBatch * proto::kMaxDatagramBytes);
  std::array<transport::RxDatagram, kBatch> rx;
  for (size_t i = 0; i < kBatch; ++i) {
    rx[i].buffer = {rx_bufs.data() + i * proto::kMaxDatagramBytes, proto::kMaxDatagramBytes};
  }
  // Replies of one batch: each reply's bytes once, its destinations referencing them.
  std::vector<uint8_t> reply_bufs(kBatch * proto::kMaxDatagramBytes);
  std::vector<transport::TxDatagram> tx;
  tx.reserve(kBatch * options_.switch_config.max_workers_per_job);
  std::uniform_real_distribution<double> coin(0.0, 1.0);
  const double loss = options_.loss;
  while (!stop_.load()) {
    auto r = transport_->Receive(rx, std::chrono::milliseconds(200));
    if (!r.ok()) {
      LOG(kError, kDataplane) << "receive failed: " << r.status().ToString();
      std::this_thread::sleep_for(std::chrono::milliseconds(10));  // do not spin on a hard error
      continue;
    }
    if (*r == 0) continue;
    received_ += *r;
    tx.clear();
    {
      std::lock_guard<std::mutex> lock(switch_->mu);
      for (size_t i = 0; i < *r; ++i) {
        if (rx[i].truncated) {  // longer than any SwitchML packet: not ours
          ++truncated_;
          continue;
        }
        if (loss > 0 && coin(rng_) < loss) {
          ++loss_in_;
          continue;
        }
        const dataplane::Action& a =
            switch_->sw.Process(rx[i].source, rx[i].buffer.first(rx[i].length));
        if (a.kind == dataplane::Action::Kind::kDrop) continue;
        uint8_t* copy = reply_bufs.data() + i * proto::kMaxDatagramBytes;
        std::copy(a.reply.begin(), a.reply.end(), copy);
        for (const Endpoint& dst : a.destinations) {
          if (loss > 0 && coin(rng_) < loss) {
            ++loss_out_;
            continue;
          }
          tx.push_back(transport::TxDatagram{dst, {copy, a.reply.size()}});
        }
      }
    }
    size_t done = 0;
    for (int attempt = 0; done < tx.size() && attempt < 1000; ++attempt) {
      auto s = transport_->Send(std::span(tx).subspan(done));
      if (!s.ok()) {
        LOG(kError, kDataplane) << "send failed: " << s.status().ToString();
        break;
      }
      done += *s;
      if (done < tx.size()) std::this_thread::yield();
    }
    sent_ += done;
  }
}

DaemonCounters SwitchDaemon::counters() const {
  return DaemonCounters{received_.load(), sent_.load(), loss_in_.load(), loss_out_.load(),
                        truncated_.load()};
}

std::string SwitchDaemon::FormatCounters(bool per_slot) {
  const DaemonCounters c = counters();
  std::ostringstream out;
  out << "daemon: received " << c.received << ", sent " << c.sent;
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
