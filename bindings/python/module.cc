// switchml._core: the worker library for Python (pybind11). The public Python API is the package
// bindings/python/switchml/, which re-exports these names; docs/python.md describes it.
//
// Buffers: any object with the buffer protocol (NumPy arrays, bytearray, memoryview, array.array)
// of float32 ('f'), int32 ('i', or 'l' when 4 bytes) or float16 ('e'), in this machine's byte
// order (a '>' or '!' prefix here is refused). A C-contiguous float32 or
// int32 buffer is used in place, without a copy; a strided or float16 one goes through a
// contiguous staging copy (float16 widened to float32 and narrowed back).
// The GIL: released while a context is set up and while an all-reduce is waited for; a Python
// buffer is touched (staging, results) only with the GIL held.
//
// The module links libswitchml_bindings.so and sees only what it exports: the public API
// (include/switchml/) and software_switch.h.
#include <pybind11/chrono.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <bit>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "bindings/python/half.h"
#include "bindings/python/software_switch.h"
#include "bindings/python/stats.h"
#include "switchml/context.h"

namespace py = pybind11;

namespace switchml::python {
namespace {

py::object& ErrorType() {
  static py::object* type = nullptr;  // created at import, lives as long as the interpreter
  if (type == nullptr) type = new py::object();
  return *type;
}

// Raises switchml.SwitchMLError carrying the library's message, with .code ("DEADLINE_EXCEEDED").
[[noreturn]] void Raise(const Status& st) {
  py::object e = ErrorType()(st.ToString());
  e.attr("code") = StatusCodeName(st.code());
  e.attr("message") = st.message();
  PyErr_SetObject(ErrorType().ptr(), e.ptr());
  throw py::error_already_set();
}

void Check(const Status& st) {
  if (!st.ok()) Raise(st);
}

// Config.multicast: the CLI's --multicast mode over Config's three fields. The combinations no
// mode names (Config::Validate refuses them) raise when read, as validate() does.
std::string MulticastMode(const Config& c) {
  if (c.lan_multicast && !c.loopback_multicast) {
    Raise(InvalidArgumentError(
        "lan_multicast=True with loopback_multicast=False is not a multicast mode: set "
        "loopback_multicast=True (that is multicast='auto') or lan_multicast=False"));
  }
  if (c.lan_multicast_required && !c.lan_multicast) {
    Raise(InvalidArgumentError(
        "lan_multicast_required=True with lan_multicast=False is not a multicast mode: set "
        "lan_multicast=True (that is multicast='on') or lan_multicast_required=False"));
  }
  if (!c.loopback_multicast) return "off";
  if (!c.lan_multicast) return "local";
  return c.lan_multicast_required ? "on" : "auto";
}

void SetMulticastMode(Config& c, const std::string& mode) {
  if (mode != "auto" && mode != "local" && mode != "on" && mode != "off") {
    Raise(InvalidArgumentError(
        "multicast must be 'auto', 'local', 'on' or 'off', not '" + mode +
        "' (auto: loopback multicast with a switch on this host, LAN multicast where the switch "
        "and the network allow it; local: loopback only; on: as auto, but an error where the "
        "LAN group cannot be had; off: never)"));
  }
  c.loopback_multicast = mode != "off";
  c.lan_multicast = mode == "auto" || mode == "on";
  c.lan_multicast_required = mode == "on";
}

// Runs fn (returning a Status) with the GIL released, then raises its error, if any.
template <typename Fn>
void CheckWithoutGil(Fn fn) {
  Status st;
  {
    py::gil_scoped_release nogil;
    st = fn();
  }
  Check(st);
}

enum class Element { kFloat32, kInt32, kFloat16 };

// Whether a buffer format's byte-order prefix (if any) is this machine's: '@' and '=' are,
// '<' and '>' (or '!', network order) name one order explicitly.
bool NativeByteOrder(const std::string& f) {
  if (f.size() < 2) return true;
  constexpr bool kLittle = std::endian::native == std::endian::little;
  switch (f[0]) {
    case '@':
    case '=':
      return true;
    case '<':
      return kLittle;
    case '>':
    case '!':
      return !kLittle;
    default:
      return true;  // not a byte-order prefix: the checks below refuse the format
  }
}

Element ElementOf(const py::buffer_info& b) {
  const std::string& f = b.format;
  if (!NativeByteOrder(f)) {
    // The elements are used as they are in memory: summed in the wrong byte order they would
    // come back as garbage without a word.
    throw py::type_error(
        "switchml: all-reduce needs elements in this machine's byte order; got "
        "format '" +
        f + "' (convert, e.g. numpy's astype('=f4'))");
  }
  const char c = f.empty() ? '?' : f.back();  // skip byte-order prefixes such as '<' and '='
  if (f.size() <= 2 && c == 'f' && b.itemsize == 4) return Element::kFloat32;
  if (f.size() <= 2 && (c == 'i' || c == 'l') && b.itemsize == 4) return Element::kInt32;
  if (f.size() <= 2 && c == 'e' && b.itemsize == 2) return Element::kFloat16;
  throw py::type_error(
      "switchml: all-reduce needs float32, int32 or float16 elements; got format '" + f + "' of " +
      std::to_string(b.itemsize) + " bytes (convert, e.g. numpy's astype)");
}

bool IsCContiguous(const py::buffer_info& b) {
  py::ssize_t expect = b.itemsize;
  for (py::ssize_t d = b.ndim - 1; d >= 0; --d) {
    if (b.shape[d] != 1 && b.strides[d] != expect) return false;
    expect *= b.shape[d];
  }
  return true;
}

// Calls fn(element_pointer) for every element of b in C order.
template <typename Fn>
void ForEachElement(const py::buffer_info& b, Fn fn) {
  if (b.size == 0) return;
  std::vector<py::ssize_t> index(b.ndim, 0);
  auto* base = static_cast<uint8_t*>(b.ptr);
  for (py::ssize_t i = 0; i < b.size; ++i) {
    py::ssize_t offset = 0;
    for (py::ssize_t d = 0; d < b.ndim; ++d) offset += index[d] * b.strides[d];
    fn(base + offset);
    for (py::ssize_t d = b.ndim - 1; d >= 0; --d) {
      if (++index[d] < b.shape[d]) break;
      index[d] = 0;
    }
  }
}

// One all-reduce's operands: the caller's input and output buffers and, when they cannot be used
// directly, contiguous 4-byte staging. Destroy with the GIL held (it releases Python buffers).
struct Operation {
  py::object out_object;  // what allreduce returns
  py::buffer_info in, out;
  Element element = Element::kFloat32;
  std::vector<uint32_t> staging;  // 4-byte elements; empty when the buffers are used directly
  const void* in_ptr = nullptr;
  void* out_ptr = nullptr;
  bool finished = false;

  DataType dtype() const {
    return element == Element::kInt32 ? DataType::kInt32 : DataType::kFloat32;
  }
  size_t count() const { return static_cast<size_t>(in.size); }

  // Points in_ptr/out_ptr at the buffers themselves, or fills the staging copy from `in`.
  void Prepare() {
    const bool direct = element != Element::kFloat16 && IsCContiguous(in) && IsCContiguous(out);
    if (direct) {
      in_ptr = in.ptr;
      out_ptr = out.ptr;
      return;
    }
    staging.resize(count());
    uint32_t* s = staging.data();
    if (element == Element::kFloat16) {
      ForEachElement(in, [&](uint8_t* p) {
        uint16_t h;
        std::memcpy(&h, p, 2);
        const float f = HalfToFloat(h);
        std::memcpy(s++, &f, 4);
      });
    } else {
      ForEachElement(in, [&](uint8_t* p) { std::memcpy(s++, p, 4); });
    }
    in_ptr = out_ptr = staging.data();
  }

  // Copies the staged result into `out` (once).
  void Finish() {
    if (finished) return;
    finished = true;
    if (staging.empty()) return;
    const uint32_t* s = staging.data();
    if (element == Element::kFloat16) {
      ForEachElement(out, [&](uint8_t* p) {
        float f;
        std::memcpy(&f, s++, 4);
        const uint16_t h = FloatToHalf(f);
        std::memcpy(p, &h, 2);
      });
    } else {
      ForEachElement(out, [&](uint8_t* p) { std::memcpy(p, s++, 4); });
    }
  }
};

std::unique_ptr<Operation> MakeOperation(const py::buffer& x, const py::object& out) {
  auto op = std::make_unique<Operation>();
  op->in = x.request();
  op->element = ElementOf(op->in);
  if (out.is_none()) {
    // A new C-contiguous array of x's shape and element type (NumPy when there is one).
    py::object numpy = py::module_::import("numpy");
    const char* dt = op->element == Element::kFloat32 ? "float32"
                     : op->element == Element::kInt32 ? "int32"
                                                      : "float16";
    py::tuple shape(op->in.ndim);
    for (py::ssize_t d = 0; d < op->in.ndim; ++d) shape[d] = op->in.shape[d];
    op->out_object = numpy.attr("empty")(shape, py::arg("dtype") = dt);
  } else {
    op->out_object = out;
  }
  op->out = py::reinterpret_borrow<py::buffer>(op->out_object).request(/*writable=*/true);
  if (ElementOf(op->out) != op->element) {
    throw py::type_error("switchml: out has format '" + op->out.format +
                         "' but the input has format '" + op->in.format + "'");
  }
  if (op->out.size != op->in.size) {
    throw py::value_error("switchml: out has " + std::to_string(op->out.size) +
                          " elements but the input has " + std::to_string(op->in.size));
  }
  op->Prepare();
  return op;
}

// The handle of an asynchronous all-reduce; keeps its buffers and its context alive.
class Handle {
 public:
  Handle(AllReduceHandle h, std::unique_ptr<Operation> op, py::object context)
      : handle_(std::move(h)), op_(std::move(op)), context_(std::move(context)) {}
  Handle(const Handle&) = delete;
  ~Handle() {
    // The library may still write into the buffers: never release them before it has ended.
    if (op_ && !handle_.Test()) {
      py::gil_scoped_release nogil;
      handle_.Wait().IgnoreError();
    }
  }

  bool is_completed() const { return handle_.Test(); }

  // Blocks (without the GIL) until the all-reduce ends; returns the output or raises.
  py::object Wait() {
    CheckWithoutGil([&] { return handle_.Wait(); });
    op_->Finish();
    return op_->out_object;
  }

 private:
  AllReduceHandle handle_;
  std::unique_ptr<Operation> op_;
  py::object context_;
};

class WorkerContext {
 public:
  explicit WorkerContext(std::unique_ptr<Context> ctx) : ctx_(std::move(ctx)) {}

  py::object AllReduce(const py::buffer& x, const py::object& out) {
    std::unique_ptr<Operation> op = MakeOperation(x, out);
    CheckWithoutGil(
        [&] { return ctx_->AllReduce(op->in_ptr, op->out_ptr, op->count(), op->dtype()); });
    op->Finish();
    return op->out_object;
  }

  std::unique_ptr<Handle> AllReduceAsync(py::object self, const py::buffer& x,
                                         const py::object& out) {
    std::unique_ptr<Operation> op = MakeOperation(x, out);
    Result<AllReduceHandle> h =
        ctx_->AllReduceAsync(op->in_ptr, op->out_ptr, op->count(), op->dtype());
    if (!h.ok()) Raise(h.status());
    return std::make_unique<Handle>(std::move(h).value(), std::move(op), std::move(self));
  }

  void Barrier() {
    CheckWithoutGil([&] { return ctx_->Barrier(); });
  }
  void WaitForAll() {
    CheckWithoutGil([&] { return ctx_->WaitForAll(); });
  }

  Context& context() { return *ctx_; }

 private:
  std::unique_ptr<Context> ctx_;
};

std::unique_ptr<WorkerContext> CreateContext(const py::object& config, const py::kwargs& kwargs) {
  Config c = config.is_none() ? Config() : config.cast<Config>();
  py::object view = py::cast(&c, py::return_value_policy::reference);
  for (auto [key, value] : kwargs) {
    const std::string name = py::str(key);
    if (name.starts_with("_") || !py::hasattr(view, key)) {
      throw py::type_error("switchml.Context: unknown option '" + name +
                           "' (the options are the fields of switchml.Config)");
    }
    py::setattr(view, key, value);
  }
  Result<std::unique_ptr<Context>> ctx = Status();
  {
    py::gil_scoped_release nogil;
    ctx = Context::Create(c);
  }
  if (!ctx.ok()) Raise(ctx.status());
  return std::make_unique<WorkerContext>(std::move(ctx).value());
}

// An in-process software switch, for tests and single-machine jobs (the `switchml switch`
// command is the same daemon as a process).
class InProcessSwitch {
 public:
  explicit InProcessSwitch(const SoftwareSwitchOptions& options) {
    auto s = SoftwareSwitch::Start(options);
    if (!s.ok()) Raise(s.status());
    switch_ = std::move(s).value();
  }
  uint16_t data_port() const { return Get().data_port(); }
  uint16_t control_port() const { return Get().control_port(); }
  py::dict Counters() const {
    const SoftwareSwitchCounters c = Get().counters();
    py::dict d;
    d["received"] = c.received;
    d["sent"] = c.sent;
    d["truncated"] = c.truncated;
    d["auth_dropped"] = c.auth_dropped;
    return d;
  }
  void Stop() {
    py::gil_scoped_release nogil;
    switch_.reset();
  }

 private:
  const SoftwareSwitch& Get() const {
    if (!switch_) throw py::value_error("switchml.Switch: stopped");
    return *switch_;
  }
  std::unique_ptr<SoftwareSwitch> switch_;
};

// The module's contents, one function per class or area; PYBIND11_MODULE calls them in order.

// switchml.SwitchMLError, which Raise() throws.
void BindError(py::module_& m) {
  ErrorType() = py::reinterpret_steal<py::object>(
      PyErr_NewExceptionWithDoc("switchml.SwitchMLError",
                                "An error from the SwitchML library; .code names its kind "
                                "(e.g. 'DEADLINE_EXCEEDED', 'UNAVAILABLE'), str() says what to do.",
                                PyExc_RuntimeError, nullptr));
  m.attr("SwitchMLError") = ErrorType();
}

// switchml.TRANSPORTS: the data-plane transports Config.transport and Switch(transport=) accept.
void BindTransports(py::module_& m) {
  const std::vector<std::string> names = TransportNames();
  py::tuple kinds(names.size());
  for (size_t i = 0; i < names.size(); ++i) kinds[i] = names[i];
  m.attr("TRANSPORTS") = kinds;
}

using PyConfig = py::class_<Config>;

// Config: who the worker is, where the switch is, and the job's shape.
void BindConfigJob(PyConfig& config) {
  config.def_readwrite("rank", &Config::rank, "this worker's rank in [0, num_workers)");
  config.def_readwrite("num_workers", &Config::num_workers, "the job's number of workers");
  config.def_readwrite("switch_host", &Config::switch_host, "the switch's control-plane host");
  config.def_readwrite("control_port", &Config::control_port, "the switch's control-plane port");
  config.def_readwrite("switch_hosts", &Config::switch_hosts,
                       "a job striped over several switch hosts: their control planes, each "
                       "'host' or 'host:port' (port: control_port), the same list in the same "
                       "order on every worker; replaces switch_host (docs/deployment.md)");
  config.def_readwrite("session_id", &Config::session_id,
                       "the job's id on the switch (0: rank 0 picks one)");
  config.def_readwrite("num_worker_threads", &Config::num_worker_threads,
                       "worker threads (0: as many as the switch's data-plane threads)");
  config.def_readwrite(
      "max_outstanding_packets", &Config::max_outstanding_packets,
      "packets in flight per worker (switch slots); 0: from link_gbps and base_rtt");
  config.def_readwrite("link_gbps", &Config::link_gbps,
                       "link rate (Gbit/s) the automatic window is sized for");
  config.def_readwrite("base_rtt", &Config::base_rtt,
                       "round-trip time the automatic window is sized for");
  config.def_readwrite("packet_numel", &Config::packet_numel,
                       "elements per packet: 64 or 256, or 512, 1024 or 2048 where the switch "
                       "enables jumbo packets (docs/protocol.md 2.6); 0: automatic, the largest "
                       "the switch, the transport and the MTU allow (the context's config names "
                       "the size chosen)");
}

// One field of an options struct Config holds whole (Config::retransmit, Config::wait) as an
// attribute of Config itself, under the name it had before the struct gathered them.
template <typename Options, typename T>
void BindNestedField(PyConfig& config, const char* name, Options Config::*options,
                     T Options::*field, const char* doc) {
  config.def_property(
      name, [options, field](const Config& c) { return c.*options.*field; },
      [options, field](Config& c, T value) { c.*options.*field = value; }, doc);
}

// Config: the data plane's sockets, transport and threads.
void BindConfigDataPlane(PyConfig& config) {
  config.def_readwrite("bind_address", &Config::bind_address, "local IPv4 address to bind");
  config.def_readwrite("udp_port", &Config::udp_port, "first local UDP port (0: any)");
  config.def_readwrite(
      "transport", &Config::transport,
      "data-plane transport, one of switchml.TRANSPORTS: 'udp' (kernel UDP with GSO/GRO), "
      "'udp-plain' (without them), 'xdp' (AF_XDP; root), 'dpdk', or 'shm' (shared-memory rings "
      "to a switch on this host, in $SWITCHML_SHM_DIR or /dev/shm/switchml-<uid>), or 'auto' "
      "(the one the switch serves, udp or shm, asked at setup; a Context's config then names "
      "the one chosen)");
  BindNestedField(config, "busy_poll", &Config::wait, &WaitOptions::busy_poll,
                  "poll without sleeping");
  config.def_readwrite(
      "pin_threads", &Config::pin_threads,
      "pin worker thread t to the t-th CPU this process may use (docs/architecture.md, \"Pinned "
      "threads\"): for workers on the switch's host whose switch runs with --pin-threads");
  BindNestedField(
      config, "wake_batch", &Config::wait, &WaitOptions::wake_batch,
      "wake-up batching in [0, 1] (docs/architecture.md 4.6; 0: off): after handling results a "
      "worker thread sleeps until about this fraction of its packets in flight should be back");
}

// Config: multicast results, as three fields and as the CLI's one mode.
void BindConfigMulticast(PyConfig& config) {
  config.def_readwrite("loopback_multicast", &Config::loopback_multicast,
                       "with a switch on this host, results come once to a multicast group of "
                       "the job (docs/architecture.md, \"Multicast results\"); on by default");
  config.def_readwrite("lan_multicast", &Config::lan_multicast,
                       "with a switch on another host, results come once to a group joined on "
                       "the interface toward it, replicated by the network, where the switch "
                       "and the network allow it; on by default");
  config.def_readwrite("lan_multicast_required", &Config::lan_multicast_required,
                       "LAN multicast or an error (setup fails without the group, a job when "
                       "the network does not deliver it); off by default");
  config.def_property(
      "multicast", &MulticastMode, &SetMulticastMode,
      "the three multicast fields as switchml worker's --multicast: 'auto' (loopback multicast, "
      "and LAN multicast where the switch and the network allow it; the default), 'local' "
      "(loopback multicast only), 'on' (as auto, but an error without the LAN group) or 'off' "
      "(neither); a combination none of them names: reading it raises SwitchMLError, as "
      "validate() does");
}

// Config: retransmission and the deadlines of setup and all-reduces.
void BindConfigTimeouts(PyConfig& config) {
  BindNestedField(config, "timeout", &Config::retransmit, &RetransmitOptions::timeout,
                  "a packet's retransmission timeout before round trips are measured");
  BindNestedField(config, "min_timeout", &Config::retransmit, &RetransmitOptions::min_timeout,
                  "the retransmission timeout's floor");
  BindNestedField(config, "max_timeout", &Config::retransmit, &RetransmitOptions::max_timeout,
                  "the retransmission timeout's ceiling");
  BindNestedField(config, "early_retransmit_after", &Config::retransmit,
                  &RetransmitOptions::early_retransmit_after,
                  "re-send a packet whose result is still missing once the results of "
                  "this many packets sent after it arrived (TCP's fast retransmit); 0: off");
  BindNestedField(config, "timeout_threshold", &Config::retransmit,
                  &RetransmitOptions::timeout_threshold, "back-off threshold");
  BindNestedField(config, "timeout_threshold_increment", &Config::retransmit,
                  &RetransmitOptions::timeout_threshold_increment, "back-off threshold increment");
  BindNestedField(config, "peer_timeout", &Config::retransmit, &RetransmitOptions::peer_timeout,
                  "an all-reduce fails when no result arrives for this long");
  config.def_readwrite("setup_timeout", &Config::setup_timeout,
                       "session setup and barrier timeout");
}

// Config: what every worker of a job must agree on beyond its shape (checks, sparsity).
void BindConfigAgreements(PyConfig& config) {
  config.def_readwrite("check_tensors", &Config::check_tensors,
                       "have the switch check that every worker all-reduces the same element "
                       "count and type (one control message per all-reduce)");
  config.def_readwrite("sparse", &Config::sparse,
                       "block-sparse all-reduces (docs/protocol.md 2.5): only the blocks non-zero "
                       "on some worker cross the network; every worker of a job must set the same");
  config.def_readwrite("sparse_auto", &Config::sparse_auto,
                       "with sparse, the automatic choice (docs/protocol.md 2.5): a worker "
                       "thread's share whose union holds more than 7/8 of its blocks runs dense; "
                       "a switch without block-sparse support makes the job dense");
}

// Config: the job's secret, the authenticated data plane and TLS (docs/security.md).
void BindConfigSecurity(PyConfig& config) {
  config.def_readwrite("authenticate_data", &Config::authenticate_data,
                       "the authenticated data plane (docs/security.md 4.4): every datagram "
                       "carries a tag keyed per job; every worker of a job must set the same");
  config.def_readwrite("job_secret", &Config::job_secret,
                       "the job's secret (at most 64 bytes), the same on every worker; empty: an "
                       "unprotected job (docs/security.md)");
  config.def_readwrite("tls_ca_file", &Config::tls_ca_file,
                       "PEM CA of the switch's certificate: TLS on the control channel");
  config.def_readwrite("tls_cert_file", &Config::tls_cert_file,
                       "PEM client certificate, for a switch that requires one");
  config.def_readwrite("tls_key_file", &Config::tls_key_file, "PEM private key of tls_cert_file");
  config.def_readwrite("tls_server_name", &Config::tls_server_name,
                       "the name in the switch's certificate (default: switch_host)");
}

void BindConfig(py::module_& m) {
  PyConfig config(m, "Config",
                  "Everything a worker needs to join a job (switchml::Config). Every field is also "
                  "a keyword argument of Context(). Durations are datetime.timedelta or float "
                  "seconds.");
  config.def(py::init<>());
  BindConfigJob(config);
  BindConfigDataPlane(config);
  BindConfigMulticast(config);
  BindConfigTimeouts(config);
  BindConfigAgreements(config);
  BindConfigSecurity(config);
  config.def(
      "validate", [](const Config& c) { Check(c.Validate()); },
      "Raises SwitchMLError saying which field is wrong.");
}

void BindHandle(py::module_& m) {
  py::class_<Handle>(m, "Handle", "An asynchronous all-reduce in flight.")
      .def("wait", &Handle::Wait,
           "Blocks until the all-reduce ends (the GIL released); returns its output array or "
           "raises SwitchMLError.")
      .def("is_completed", &Handle::is_completed,
           "True once the all-reduce has ended (wait() then returns at once).");
}

void BindContext(py::module_& m) {
  py::class_<WorkerContext>(m, "Context",
                            "One worker's membership in a SwitchML job. Context(config=None, "
                            "**options): options are Config fields; blocks until every worker "
                            "joined.")
      .def(py::init(&CreateContext), py::arg("config") = py::none())
      .def("allreduce", &WorkerContext::AllReduce, py::arg("x"), py::arg("out") = py::none(),
           "Sums x over the job's workers into out (a new array when None; out may be x). "
           "Blocks without the GIL. int32 sums are exact; float32 and float16 are quantized.")
      .def(
          "allreduce_async",
          [](py::object self, const py::buffer& x, const py::object& out) {
            return self.cast<WorkerContext&>().AllReduceAsync(self, x, out);
          },
          py::arg("x"), py::arg("out") = py::none(),
          "Starts an all-reduce and returns a Handle; x and out must not change until it ends.")
      .def("barrier", &WorkerContext::Barrier, "Waits until every worker of the job arrives.")
      .def("wait_for_all", &WorkerContext::WaitForAll, "Waits for every all-reduce started so far.")
      .def_property_readonly("session_id",
                             [](WorkerContext& c) { return c.context().session_id(); })
      .def_property_readonly("rank", [](WorkerContext& c) { return c.context().config().rank; })
      .def_property_readonly("num_workers",
                             [](WorkerContext& c) { return c.context().config().num_workers; })
      .def_property_readonly(
          "config", [](WorkerContext& c) { return c.context().config(); },
          "A copy of the Config this context runs with (session_id as given, 0 if picked).")
      .def(
          "stats", [](WorkerContext& c) { return StatsDict(c.context().stats()); },
          "The worker's counters (switchml::ContextStats) as a dict.");
}

void BindSwitch(py::module_& m) {
  py::class_<InProcessSwitch>(
      m, "Switch",
      "An in-process software switch (as `switchml switch`); port 0 picks a free one; "
      "require_authenticated_data: refuse jobs without Config.authenticate_data (as "
      "`switchml switch --require-auth-data`); transport: the data plane's, one of "
      "switchml.TRANSPORTS (as `switchml switch --transport`; the workers use the same); "
      "max_packet_numel: the largest packet_numel a job may use, 256, 512, 1024 or 2048 (as "
      "`switchml switch --max-packet-numel`; 0, the default: the largest the transport carries, "
      "2048 for udp and shm).")
      .def(py::init([](const std::string& bind_address, uint16_t data_port, uint16_t control_port,
                       bool require_authenticated_data, const std::string& transport,
                       uint32_t max_packet_numel) {
             return std::make_unique<InProcessSwitch>(
                 SoftwareSwitchOptions{.bind_address = bind_address,
                                       .data_port = data_port,
                                       .control_port = control_port,
                                       .require_authenticated_data = require_authenticated_data,
                                       .transport = transport,
                                       .max_packet_numel = max_packet_numel});
           }),
           py::arg("bind_address") = "127.0.0.1", py::arg("data_port") = 0,
           py::arg("control_port") = 0, py::arg("require_authenticated_data") = false,
           py::arg("transport") = "udp", py::arg("max_packet_numel") = 0)
      .def_property_readonly("data_port", &InProcessSwitch::data_port)
      .def_property_readonly("control_port", &InProcessSwitch::control_port)
      .def("counters", &InProcessSwitch::Counters,
           "The data plane's datagram counters: received, sent, truncated (oversized, dropped) "
           "and auth_dropped (tags that did not verify, dropped).")
      .def("stop", &InProcessSwitch::Stop, "Stops the switch.");
}

}  // namespace
}  // namespace switchml::python

PYBIND11_MODULE(_core, m) {
  using namespace switchml::python;
  m.doc() = "SwitchML worker library (in-network aggregation); see the switchml package";
  BindError(m);
  BindTransports(m);
  BindConfig(m);
  BindHandle(m);
  BindContext(m);
  BindSwitch(m);
}
