#include "transport/environment.h"

#include <unistd.h>

#include <charconv>
#include <cstdint>
#include <cstdlib>
#include <sstream>
#include <string_view>

#include "base/endpoint.h"
#include "base/status_macros.h"
#include "transport/shm.h"

namespace switchml::transport {
namespace {

// A variable's value when it is set and not empty.
std::optional<std::string> Get(const EnvironmentLookup& env, const char* name) {
  std::optional<std::string> v = env(name);
  if (v && v->empty()) return std::nullopt;
  return v;
}

Status Refuse(const char* name, const std::string& accepts, const std::string& got) {
  return InvalidArgumentError(std::string(name) + " must be " + accepts + ", not '" + got + "'");
}

// A whole number in [min, max], all of the text.
Result<uint64_t> Count(const char* name, const std::string& text, uint64_t min, uint64_t max) {
  uint64_t v = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || end != text.data() + text.size() || v < min || v > max) {
    return Refuse(name, "a whole number in " + std::to_string(min) + ".." + std::to_string(max),
                  text);
  }
  return v;
}

// Sets *out from a count variable, when set.
template <typename T>
Status ReadCount(const EnvironmentLookup& env, const char* name, uint64_t min, uint64_t max,
                 T* out) {
  const std::optional<std::string> v = Get(env, name);
  if (!v) return Status();
  ASSIGN_OR_RETURN(const uint64_t n, Count(name, *v, min, max));
  *out = static_cast<T>(n);
  return Status();
}

Status ReadMicroseconds(const EnvironmentLookup& env, const char* name, uint64_t min,
                        std::chrono::microseconds* out) {
  uint64_t us = static_cast<uint64_t>(out->count());
  RETURN_IF_ERROR(ReadCount(env, name, min, 3600000000, &us));
  *out = std::chrono::microseconds(us);
  return Status();
}

// An on/off variable spelled 0|1: 1 is on, 0 off; `on` says what 1 means.
Status ReadZeroOne(const EnvironmentLookup& env, const char* name, const char* on, bool* out) {
  const std::optional<std::string> v = Get(env, name);
  if (!v) return Status();
  if (*v != "0" && *v != "1") return Refuse(name, std::string("0 or 1 (1: ") + on + ")", *v);
  *out = *v == "1";
  return Status();
}

void ReadText(const EnvironmentLookup& env, const char* name, std::string* out) {
  if (std::optional<std::string> v = Get(env, name)) *out = std::move(*v);
}

// "02:00:00:00:00:01" (or with dashes): six hex pairs.
bool ParseMacText(std::string_view text, std::array<uint8_t, 6>* mac) {
  if (text.size() != 17) return false;
  for (size_t i = 0; i < 6; ++i) {
    if (i > 0 && text[3 * i - 1] != ':' && text[3 * i - 1] != '-') return false;
    const char* first = text.data() + 3 * i;
    auto [end, ec] = std::from_chars(first, first + 2, (*mac)[i], 16);
    if (ec != std::errc() || end != first + 2) return false;
  }
  return true;
}

// SWITCHML_DPDK_NEIGH: "ip=mac,ip=mac" (commas or spaces between entries).
Status ReadNeighbours(const EnvironmentLookup& env, std::vector<DpdkNeighbour>* out) {
  std::optional<std::string> text = Get(env, "SWITCHML_DPDK_NEIGH");
  if (!text) return Status();
  for (char& c : *text) c = c == ',' ? ' ' : c;
  std::istringstream in(*text);
  std::vector<DpdkNeighbour> parsed;
  for (std::string entry; in >> entry;) {
    const size_t eq = entry.find('=');
    DpdkNeighbour n;
    if (eq == std::string::npos || !ParseIpv4(entry.substr(0, eq), &n.ipv4) ||
        !ParseMacText(std::string_view(entry).substr(eq + 1), &n.mac)) {
      return InvalidArgumentError("SWITCHML_DPDK_NEIGH: '" + entry +
                                  "' is not ipv4=mac (e.g. 10.0.0.1=02:00:00:00:00:01)");
    }
    parsed.push_back(n);
  }
  *out = std::move(parsed);
  return Status();
}

}  // namespace

EnvironmentLookup ProcessEnvironment() {
  return [](const char* name) -> std::optional<std::string> {
    const char* v = std::getenv(name);
    if (v == nullptr) return std::nullopt;
    return std::string(v);
  };
}

Status ReadXdpEnvironment(const EnvironmentLookup& env, XdpOptions* o) {
  ReadText(env, "SWITCHML_XDP_IFACE", &o->interface);
  if (std::optional<std::string> q = Get(env, "SWITCHML_XDP_QUEUE")) {
    uint32_t queue = 0;
    auto [end, ec] = std::from_chars(q->data(), q->data() + q->size(), queue);
    if (ec != std::errc() || end != q->data() + q->size()) {
      return Refuse("SWITCHML_XDP_QUEUE", "a queue id (0, 1, ...)", *q);
    }
    o->queue = queue;
  }
  if (std::optional<std::string> m = Get(env, "SWITCHML_XDP_MODE")) {
    if (*m == "auto") {
      o->mode = XdpAttachMode::kAuto;
    } else if (*m == "native") {
      o->mode = XdpAttachMode::kNative;
    } else if (*m == "generic") {
      o->mode = XdpAttachMode::kGeneric;
    } else {
      return Refuse("SWITCHML_XDP_MODE", "auto, native or generic", *m);
    }
  }
  RETURN_IF_ERROR(ReadZeroOne(env, "SWITCHML_XDP_COPY", "copy mode only", &o->copy_only));
  RETURN_IF_ERROR(ReadZeroOne(env, "SWITCHML_XDP_DEBUG", "print libbpf's warnings", &o->debug));
  ReadText(env, "SWITCHML_XDP_LOCK_DIR", &o->lock_dir);
  return Status();
}

Status ReadDpdkEnvironment(const EnvironmentLookup& env, DpdkOptions* o) {
  ReadText(env, "SWITCHML_DPDK_DEVICE", &o->device);
  ReadText(env, "SWITCHML_DPDK_EAL", &o->eal_args);
  if (std::optional<std::string> e = Get(env, "SWITCHML_DPDK_MEMIF_INTERFACES")) {
    // (from_chars, all of the text: "8x" was 8)
    uint32_t n = 0;
    auto [end, ec] = std::from_chars(e->data(), e->data() + e->size(), n);
    if (ec != std::errc() || end != e->data() + e->size() || n < 1 || n > 256) {
      return Refuse("SWITCHML_DPDK_MEMIF_INTERFACES", "in 1..256", *e);
    }
    o->memif_interfaces = n;
  }
  ReadText(env, "SWITCHML_DPDK_MEMIF_SOCKET", &o->memif_socket);
  ReadText(env, "SWITCHML_DPDK_LOCK_DIR", &o->lock_dir);
  RETURN_IF_ERROR(ReadNeighbours(env, &o->neighbours));
  if (std::optional<std::string> e = Get(env, "SWITCHML_DPDK_DOORBELL")) {
    if (*e != "on" && *e != "off") {
      return Refuse("SWITCHML_DPDK_DOORBELL", "on (the default) or off", *e);
    }
    o->doorbells = *e == "on";
  }
  if (std::optional<std::string> e = Get(env, "SWITCHML_DPDK_POLL")) {
    if (*e != "spin") return Refuse("SWITCHML_DPDK_POLL", "spin (never sleep) or unset", *e);
    o->spin_only = true;
  }
  RETURN_IF_ERROR(ReadCount(env, "SWITCHML_DPDK_SPIN", 0, UINT32_MAX, &o->spin_polls));
  RETURN_IF_ERROR(ReadMicroseconds(env, "SWITCHML_DPDK_NAP_US", 1, &o->first_nap));
  RETURN_IF_ERROR(ReadMicroseconds(env, "SWITCHML_DPDK_MAX_NAP_US", 1, &o->max_nap));
  RETURN_IF_ERROR(ReadMicroseconds(env, "SWITCHML_DPDK_MAX_SLEEP_US", 1, &o->max_sleep));
  RETURN_IF_ERROR(ReadMicroseconds(env, "SWITCHML_DPDK_YIELD_US", 0, &o->yield_for));
  return Status();
}

Status ReadShmEnvironment(const EnvironmentLookup& env, ShmOptions* o) {
  ReadText(env, "SWITCHML_SHM_DIR", &o->directory);
  return Status();
}

std::string DefaultShmDirectory() {
  ShmOptions o;
  (void)ReadShmEnvironment(ProcessEnvironment(), &o);  // (it refuses nothing)
  return ShmDirectory(o);
}

}  // namespace switchml::transport
