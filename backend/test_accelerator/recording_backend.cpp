// RecordingBackend: a c10d backend for the delegation tests. It hands the
// calls the tests make to an inner backend (Gloo) and records each call of
// the Backend API that dlop passes on to its delegate, with its arguments,
// so that a test sees which reached the delegate, including those Gloo
// implements as no-ops or refuses (abort, coalescing, hooks, allocators).
#include "recording_backend.hpp"

#include <c10/core/CPUAllocator.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>

#include <string>
#include <utility>
#include <vector>

namespace py = pybind11;

namespace dlop::test_accelerator {
namespace {

using c10d::Work;
using WorkPtr = c10::intrusive_ptr<Work>;

// The coalesced calls as one Work, each waited once (Gloo's p2p Works wait
// for their buffer each time).
class GroupWork final : public Work {
 public:
  GroupWork(int rank, std::vector<WorkPtr> works) : Work(rank, c10d::OpType::COALESCED), works_(std::move(works)) {}
  bool isCompleted() override {
    for (const auto& work : works_) {
      if (!work->isCompleted()) return false;
    }
    return true;
  }
  bool wait(std::chrono::milliseconds timeout) override {
    for (const auto& work : works_) work->wait(timeout);
    return true;
  }

 private:
  std::vector<WorkPtr> works_;
};

class RecordingBackend final : public c10d::Backend {
 public:
  explicit RecordingBackend(c10::intrusive_ptr<c10d::Backend> inner)
      : c10d::Backend(inner->getRank(), inner->getSize()), inner_(std::move(inner)) {}
  const std::string getBackendName() const override { return "recording"; }
  const std::vector<std::string>& calls() const { return calls_; }

  // What dlop passes on.
  void abort() override { calls_.push_back("abort"); }
  void shutdown() override { calls_.push_back("shutdown"); }
  void setTimeout(std::chrono::milliseconds timeout) override {
    calls_.push_back("setTimeout " + std::to_string(timeout.count()));
    inner_->setTimeout(timeout);
  }
  bool supportsCoalescing() const override { return true; }
  void startCoalescing() override {
    calls_.push_back("startCoalescing");
    coalesced_.clear();
  }
  // The coalesced calls went to the inner backend one by one.
  WorkPtr endCoalescing() override {
    calls_.push_back("endCoalescing " + std::to_string(coalesced_.size()));
    return c10::make_intrusive<GroupWork>(getRank(), std::exchange(coalesced_, {}));
  }
  void eagerConnectSingleDevice(at::Device device) override {
    const auto bound = getBoundDeviceId();
    calls_.push_back("eagerConnectSingleDevice " + device.str() + " bound " + (bound ? bound->str() : "none"));
  }
  std::shared_ptr<c10::Allocator> getMemAllocator() override {
    calls_.push_back("getMemAllocator");
    return {c10::GetCPUAllocator(), [](c10::Allocator*) {}};  // torch's, never freed
  }
  void registerOnCompletionHook(std::function<void(std::shared_ptr<c10d::WorkInfo>)>&& hook) override {
    calls_.push_back("registerOnCompletionHook");
    hook_ = std::move(hook);
  }

  // What the tests run.
  WorkPtr allreduce(std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& opts) override {
    return kept(inner_->allreduce(tensors, opts));
  }
  WorkPtr allreduce_coalesced(std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) override {
    return kept(inner_->allreduce_coalesced(tensors, opts));
  }
  WorkPtr send(std::vector<at::Tensor>& tensors, int dst, int tag) override {
    return kept(inner_->send(tensors, dst, tag));
  }
  WorkPtr recv(std::vector<at::Tensor>& tensors, int src, int tag) override {
    return kept(inner_->recv(tensors, src, tag));
  }
  WorkPtr barrier(const c10d::BarrierOptions& opts) override { return inner_->barrier(opts); }

 private:
  WorkPtr kept(WorkPtr work) {
    coalesced_.push_back(work);
    return work;
  }
  c10::intrusive_ptr<c10d::Backend> inner_;
  std::vector<std::string> calls_;
  std::vector<WorkPtr> coalesced_;
  std::function<void(std::shared_ptr<c10d::WorkInfo>)> hook_;
};

}  // namespace

void bind_recording_backend(py::module_& m) {
  py::module_::import("torch._C._distributed_c10d");  // c10d::Backend, known to pybind11 first
  py::class_<RecordingBackend, c10d::Backend, c10::intrusive_ptr<RecordingBackend>>(
      m, "RecordingBackend", "a backend over `inner` that records the Backend calls it gets (tests of delegation)")
      .def(py::init([](const c10::intrusive_ptr<c10d::Backend>& inner) {
             return c10::make_intrusive<RecordingBackend>(inner);
           }),
           py::arg("inner"))
      .def_property_readonly("calls", &RecordingBackend::calls);
}

}  // namespace dlop::test_accelerator
