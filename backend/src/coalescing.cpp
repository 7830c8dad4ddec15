// startCoalescing/endCoalescing: torch's _coalescing_manager and
// batch_isend_irecv group calls between the two. ProcessGroup hands both to
// the backend of one device type, but dlop serves every device type, and
// only the calls in between say which: the first one chooses.
#include <algorithm>
#include <atomic>
#include <string>
#include <utility>
#include <vector>

#include "backend/process_group_dlop.hpp"

namespace dlop::backend {
namespace {

// dlop's own calls of a coalesced group, as one Work: complete when all are,
// failed with the first error.
class CoalescedWork final : public c10d::Work {
 public:
  CoalescedWork(int rank, std::vector<c10::intrusive_ptr<c10d::Work>> works)
      : c10d::Work(rank, c10d::OpType::COALESCED), works_(std::move(works)),
        future_(c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()))) {
    if (works_.empty()) {  // the group's only call failed before it ran
      future_->markCompleted(c10::IValue(std::vector<at::Tensor>{}));
      return;
    }
    auto state = std::make_shared<State>();
    state->left = works_.size();
    for (const auto& work : works_) {
      work->getFuture()->addCallback([state, future = future_](c10::ivalue::Future& done) {
        if (done.hasError()) {
          if (!state->settled.exchange(true)) future->setError(done.exception_ptr());
        } else if (--state->left == 0 && !state->settled.exchange(true)) {
          future->markCompleted(c10::IValue(std::vector<at::Tensor>{}));
        }
      });
    }
  }
  bool isCompleted() override {
    return std::all_of(works_.begin(), works_.end(), [](const auto& w) { return w->isCompleted(); });
  }
  bool isSuccess() const override {
    return std::all_of(works_.begin(), works_.end(), [](const auto& w) { return w->isSuccess(); });
  }
  bool wait(std::chrono::milliseconds timeout) override {
    for (const auto& work : works_) work->wait(timeout);
    return true;
  }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }

 private:
  struct State {
    std::atomic<std::size_t> left{0};
    std::atomic<bool> settled{false};
  };
  std::vector<c10::intrusive_ptr<c10d::Work>> works_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

}  // namespace

void ProcessGroupDlop::startCoalescing() {
  TORCH_CHECK(coalescing_ == Coalescing::kOff, "dlop: startCoalescing inside a coalesced group; end it first");
  coalescing_ = Coalescing::kStarted;
  coalesced_.clear();
}

void ProcessGroupDlop::route_coalesced(bool to_delegate, c10::Device device, const char* op) {
  const auto place = [&](bool delegated) {
    return delegated ? "delegated to " + delegate_name_ : std::string("run by dlop");
  };
  if (coalescing_ == Coalescing::kStarted) {
    TORCH_CHECK_VALUE(to_delegate || device.is_cpu(), "dlop ", op, ": a coalesced group of calls on ", device.str(),
                      ", which dlop stages call by call; delegate them (DLOP_DEVICE_BACKEND=auto or the device's "
                      "backend) or make the calls outside the group");
    if (to_delegate) delegate_->startCoalescing();
    coalescing_ = to_delegate ? Coalescing::kDelegated : Coalescing::kOwn;
    coalescing_device_ = device;
    return;
  }
  const bool group_delegated = coalescing_ == Coalescing::kDelegated;
  TORCH_CHECK_VALUE(to_delegate == group_delegated && device.type() == coalescing_device_.type(), "dlop ", op,
                    ": a coalesced group's calls go to one backend; this one on ", device.str(), " is ",
                    place(to_delegate), ", the group's first on ", coalescing_device_.str(), " was ",
                    place(group_delegated));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDlop::endCoalescing() {
  TORCH_CHECK(coalescing_ != Coalescing::kOff, "dlop: endCoalescing without startCoalescing");
  const auto route = std::exchange(coalescing_, Coalescing::kOff);
  auto works = std::exchange(coalesced_, {});
  if (route == Coalescing::kDelegated) {
    auto work = delegate_->endCoalescing();
    if (work) track_delegated(work, coalescing_device_);
    return work;
  }
  // No call in the group: nothing to wait for, as with NCCL.
  if (route == Coalescing::kStarted) return {};
  return c10::make_intrusive<CoalescedWork>(getRank(), std::move(works));
}

}  // namespace dlop::backend
