// switchml._torch: ProcessGroupSwitchML for Python. switchml/torch.py registers the backend.
#include <pybind11/chrono.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>

#include <optional>
#include <string>

#include "bindings/torch/process_group.h"

namespace py = pybind11;
using switchml::torch_backend::ProcessGroupSwitchML;

PYBIND11_MODULE(_torch, m) {
  py::module_::import("torch.distributed");  // registers c10d::ProcessGroup and Store
  m.doc() = "The switchml torch.distributed backend (use `import switchml.torch`)";
  py::class_<ProcessGroupSwitchML, c10::intrusive_ptr<ProcessGroupSwitchML>, c10d::ProcessGroup>(
      m, "ProcessGroupSwitchML")
      .def(
          py::init([](const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                      const c10::intrusive_ptr<c10d::ProcessGroup>& fallback,
                      const std::string& switch_host, uint16_t control_port,
                      std::chrono::milliseconds setup_timeout, uint64_t session_id,
                      std::optional<uint32_t> num_worker_threads,
                      std::optional<uint32_t> max_outstanding_packets,
                      std::optional<uint32_t> packet_numel, std::optional<std::string> bind_address,
                      std::optional<std::string> transport, std::optional<bool> busy_poll,
                      std::optional<std::chrono::milliseconds> peer_timeout) {
            // Options left None keep switchml::Config's defaults.
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
            if (busy_poll) c.busy_poll = *busy_poll;
            if (peer_timeout) c.peer_timeout = *peer_timeout;
            return c10::make_intrusive<ProcessGroupSwitchML>(store, rank, size, c, fallback);
          }),
          py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("fallback"),
          py::arg("switch_host"), py::arg("control_port"), py::arg("setup_timeout"),
          py::arg("session_id") = 0, py::arg("num_worker_threads") = py::none(),
          py::arg("max_outstanding_packets") = py::none(), py::arg("packet_numel") = py::none(),
          py::arg("bind_address") = py::none(), py::arg("transport") = py::none(),
          py::arg("busy_poll") = py::none(), py::arg("peer_timeout") = py::none(),
          py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("session_id", &ProcessGroupSwitchML::session_id)
      .def_property_readonly("switch_calls", &ProcessGroupSwitchML::switch_calls)
      .def_property_readonly("fallback_calls", &ProcessGroupSwitchML::fallback_calls);
}
