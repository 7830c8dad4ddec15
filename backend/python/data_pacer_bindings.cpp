// dlop._C.offload.DataPacer and engine_pacer(): the seam where offloaded
// batches meet the gradient traffic. The offload library does not link the
// scheduler, so the lease manager takes any DataPacer; this one asks the
// engine of a dlop process group for credit (sched::DataCredits).
#include <torch/csrc/utils/pybind.h>

#include <pybind11/pybind11.h>

#include <memory>

#include "backend/process_group_dlop.hpp"
#include "bindings.hpp"
#include "core/config.hpp"
#include "offload/offload_client.hpp"
#include "scheduler/data_credits.hpp"

namespace py = pybind11;

namespace dlop::python {
namespace {

// Holds the credits, not the communicator: the engine must not outlive the
// process group (it refers to the group's bootstrap), while a lease manager
// may outlive it.
class EngineDataPacer final : public offload::DataPacer {
 public:
  explicit EngineDataPacer(std::shared_ptr<sched::DataCredits> credits) : credits_(std::move(credits)) {}
  std::size_t acquire(std::size_t bytes, std::uint64_t deadline_step) override {
    return credits_->acquire(bytes, deadline_step);
  }
  void set_step(std::uint64_t step) override { credits_->set_step(step); }
  std::chrono::microseconds retry_after(std::size_t bytes) override { return credits_->time_for(bytes); }
  void moved(std::size_t bytes, std::chrono::microseconds took) override { credits_->data_moved(bytes, took); }
  void add_waker(const void* key, std::function<void()> wake) override { credits_->add_waker(key, std::move(wake)); }
  void remove_waker(const void* key) override { credits_->remove_waker(key); }

 private:
  std::shared_ptr<sched::DataCredits> credits_;
};

}  // namespace

void bind_data_pacer(py::module_& root) {
  py::module_ m = root.attr("offload").cast<py::module_>();
  py::class_<offload::DataPacer, std::shared_ptr<offload::DataPacer>>(
      m, "DataPacer", "paces offloaded batches against a dlop engine's gradient traffic")
      .def("acquire", &offload::DataPacer::acquire, py::arg("bytes"), py::arg("deadline_step"),
           "bytes of `bytes` that may move now for the batch step `deadline_step` consumes")
      .def("set_step", &offload::DataPacer::set_step, py::arg("step"));
  m.def(
      "engine_pacer",
      [](backend::ProcessGroupDlop& group) -> std::shared_ptr<offload::DataPacer> {
        if (!config().traffic_classes) return nullptr;  // DLOP_TRAFFIC_CLASSES=0: no scheduling at all
        return std::make_shared<EngineDataPacer>(group.communicator().data_credits());
      },
      py::arg("group"), "a DataPacer over the group's engine credits; None with DLOP_TRAFFIC_CLASSES=0");
}

}  // namespace dlop::python
