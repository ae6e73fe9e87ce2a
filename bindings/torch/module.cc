// switchml._torch: ProcessGroupSwitchML for Python. switchml/torch.py registers the backend.
#include <pybind11/chrono.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>

#include <optional>
#include <string>

#include "bindings/python/stats.h"
#include "bindings/torch/process_group.h"
#include "switchml/config.h"

namespace py = pybind11;
using switchml::torch_backend::ProcessGroupSwitchML;

namespace {

// The Python object's reference to the process group, dropped without the GIL: destroying the
// group destroys its Gloo fallback, whose worker threads may be releasing a finished work whose
// tensors belong to Python objects, which takes the GIL. Dropped with the GIL held (pybind's
// default), that is a deadlock: the main thread waits for the worker thread in ~ProcessGroupGloo
// and the worker thread for the GIL (torch gives its own process groups such a holder too).
template <typename T>
class ReleaseWithoutGil {
 public:
  ReleaseWithoutGil() = default;
  // A new object (pybind taking ownership of a raw pointer): its first reference.
  explicit ReleaseWithoutGil(T* p) : ptr_(c10::intrusive_ptr<T>::unsafe_steal_from_new(p)) {}
  ReleaseWithoutGil(c10::intrusive_ptr<T> p) : ptr_(std::move(p)) {}  // NOLINT: implicit
  ReleaseWithoutGil(const ReleaseWithoutGil&) = default;
  ReleaseWithoutGil& operator=(const ReleaseWithoutGil&) = default;
  ~ReleaseWithoutGil() {
    if (ptr_ && PyGILState_Check()) {
      py::gil_scoped_release nogil;
      ptr_.reset();
    }
  }
  T* get() const { return ptr_.get(); }
  T& operator*() const { return *ptr_; }
  T* operator->() const { return ptr_.get(); }

 private:
  c10::intrusive_ptr<T> ptr_;
};

}  // namespace

PYBIND11_DECLARE_HOLDER_TYPE(T, ReleaseWithoutGil<T>, true);

PYBIND11_MODULE(_torch, m) {
  py::module_::import("torch.distributed");  // registers c10d::ProcessGroup and Store
  m.doc() = "The switchml torch.distributed backend (use `import switchml.torch`)";
  py::class_<ProcessGroupSwitchML, ReleaseWithoutGil<ProcessGroupSwitchML>, c10d::ProcessGroup>(
      m, "ProcessGroupSwitchML")
      .def(py::init([](const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                       const c10::intrusive_ptr<c10d::ProcessGroup>& fallback,
                       const switchml::Config& config) {
             return c10::make_intrusive<ProcessGroupSwitchML>(store, rank, size, config, fallback);
           }),
           py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("fallback"),
           py::arg("config"), py::call_guard<py::gil_scoped_release>(),
           "Joins the switch with `config` (a switchml.Config; rank and num_workers are set "
           "from rank and size, a 0 session_id and an empty job_secret are made by rank 0 and "
           "shared through the store).")
      // The keyword form it had before the Config one (kept for callers that construct the
      // group themselves): options left None keep switchml::Config's defaults.
      .def(
          py::init([](const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                      const c10::intrusive_ptr<c10d::ProcessGroup>& fallback,
                      const std::string& switch_host, uint16_t control_port,
                      std::chrono::milliseconds setup_timeout, uint64_t session_id,
                      std::optional<uint32_t> num_worker_threads,
                      std::optional<uint32_t> max_outstanding_packets,
                      std::optional<uint32_t> packet_numel, std::optional<std::string> bind_address,
                      std::optional<std::string> transport, std::optional<bool> busy_poll,
                      std::optional<std::chrono::milliseconds> peer_timeout,
                      std::optional<uint32_t> early_retransmit_after,
                      std::optional<bool> authenticate_data) {
            switchml::Config c;
            c.switch_host = switch_host;
            c.control_port = control_port;
            c.setup_timeout = setup_timeout;
            c.session_id = session_id;
            if (num_worker_threads) c.num_worker_threads = *num_worker_threads;
            if (max_outstanding_packets) c.max_outstanding_packets = *max_outstanding_packets;
            if (packet_numel) c.packet_numel = *packet_numel;
            if (bind_address) c.bind_address = *bind_address;
            if (transport) c.transport = *transport;
            if (busy_poll) c.wait.busy_poll = *busy_poll;
            if (peer_timeout) c.retransmit.peer_timeout = *peer_timeout;
            if (early_retransmit_after) {
              c.retransmit.early_retransmit_after = *early_retransmit_after;
            }
            if (authenticate_data) c.authenticate_data = *authenticate_data;
            return c10::make_intrusive<ProcessGroupSwitchML>(store, rank, size, c, fallback);
          }),
          py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("fallback"),
          py::arg("switch_host"), py::arg("control_port"), py::arg("setup_timeout"),
          py::arg("session_id") = 0, py::arg("num_worker_threads") = py::none(),
          py::arg("max_outstanding_packets") = py::none(), py::arg("packet_numel") = py::none(),
          py::arg("bind_address") = py::none(), py::arg("transport") = py::none(),
          py::arg("busy_poll") = py::none(), py::arg("peer_timeout") = py::none(),
          py::arg("early_retransmit_after") = py::none(), py::arg("authenticate_data") = py::none(),
          py::call_guard<py::gil_scoped_release>())
      .def_property_readonly(
          "config", [](const ProcessGroupSwitchML& pg) { return pg.config(); },
          "A copy of the switchml.Config the group runs with (its session id and secret "
          "included).")
      .def(
          "stats",
          [](const ProcessGroupSwitchML& pg) { return switchml::python::StatsDict(pg.stats()); },
          "The group's worker counters (switchml::ContextStats) as a dict, as "
          "switchml.Context.stats().")
      .def_property_readonly("session_id", &ProcessGroupSwitchML::session_id)
      .def_property_readonly("early_retransmit_after",
                             [](const ProcessGroupSwitchML& pg) {
                               return pg.config().retransmit.early_retransmit_after;
                             })
      .def_property_readonly(
          "authenticate_data",
          [](const ProcessGroupSwitchML& pg) { return pg.config().authenticate_data; })
      .def_property_readonly(
          "window", [](const ProcessGroupSwitchML& pg) { return pg.config().OutstandingPackets(); })
      .def_property_readonly("switch_calls", &ProcessGroupSwitchML::switch_calls)
      .def_property_readonly("fallback_calls", &ProcessGroupSwitchML::fallback_calls);
}
