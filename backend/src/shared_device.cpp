#include "shared_device.hpp"

#include <ATen/ATen.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include <atomic>
#include <functional>
#include <string>

#include "backend/process_group_dlop.hpp"
#include "backend/torch_error.hpp"
#include "core/log.hpp"
#include "device_staging.hpp"
#include "scheduler/ready_event.hpp"
#include "stream_waiter.hpp"
#include "tensor_args.hpp"
#include "work_device.hpp"

namespace dlop::backend {

// The gate of a chunk's barrier: open once `needed` things have happened on
// the host (its copy in passed, the previous chunk's reduce passed), each
// said by whoever saw it; the engine is woken then, never polling.
class HostSignal final : public sched::ReadyEvent {
 public:
  HostSignal(int needed, std::string what) : left_(needed), what_(std::move(what)) {
    if (needed == 0) open_.store(true);
  }
  void arrive() { settle(false); }
  void open() { settle(true); }
  bool ready() const override { return open_.load(std::memory_order_acquire); }
  std::string describe() const override { return what_; }
  bool notify_when_ready(std::function<void()> wake) const override {
    std::unique_lock lock(mutex_);
    if (!ready()) {
      wake_ = std::move(wake);
      return true;
    }
    lock.unlock();
    wake();
    return true;
  }

 private:
  void settle(bool all) {
    std::function<void()> wake;
    {
      std::lock_guard lock(mutex_);
      if (open_.load() || (!all && --left_ > 0)) return;
      open_.store(true, std::memory_order_release);
      wake = std::move(wake_);
    }
    if (wake) wake();
  }

  mutable std::mutex mutex_;
  int left_;  // mutex_
  std::string what_;
  mutable std::function<void()> wake_;  // mutex_
  std::atomic<bool> open_{false};
};

struct SharedDeviceArena::Chunk {
  std::uint64_t seq;
  at::Tensor source;  // the caller's elements this chunk covers
  at::Tensor dest;    // where the reduce writes them (the same elements)
  std::optional<at::Tensor> factor;
  c10d::ReduceOp op;
  std::shared_ptr<c10::Event> after_caller;  // the caller's work queued before the call
  int64_t total = 0;                         // elements of the whole call
  int64_t index = 0;                         // this chunk's, in the call
  at::Tensor result, caller;                 // last chunk of a non-contiguous call: copy result into caller
  std::shared_ptr<HostSignal> gate;
  bool copy_queued = false;
};

namespace {

bool served_dtype(at::ScalarType t, bool bitwise) {
  switch (t) {
    case at::kFloat:
    case at::kDouble:
    case at::kHalf:
    case at::kBFloat16:
      return !bitwise;
    case at::kByte:
    case at::kChar:
    case at::kShort:
    case at::kInt:
    case at::kLong:
      return true;
    default:
      return false;
  }
}

// What every rank must agree on for a chunk: its count, the call's total,
// the chunk's index, the dtype and the operation; after a MAX all-reduce,
// each pair (x, -x) holds the largest and minus the smallest any rank passed.
constexpr int kAgreed = 5;
at::Tensor agreement(int64_t count, int64_t total, int64_t index, const at::Tensor& t, const c10d::ReduceOp& op) {
  const auto dtype = static_cast<int64_t>(t.scalar_type());
  const auto kind = static_cast<int64_t>(op.op_);
  return at::tensor({count, -count, total, -total, index, -index, dtype, -dtype, kind, -kind}, at::kLong);
}

// out = the views combined, in rank order.
void combine(at::Tensor out, const std::vector<at::Tensor>& views, const c10d::ReduceOp& op) {
  using R = c10d::ReduceOp::RedOpType;
  const auto n = static_cast<int64_t>(views.size());
  const auto fold = [&](auto&& first, auto&& then) {
    first(out, views[0], views[1]);
    for (std::size_t r = 2; r < views.size(); ++r) then(out, views[r]);
  };
  switch (op.op_) {
    case R::SUM:
    case R::PREMUL_SUM:
    case R::AVG:
      fold([](auto& o, auto& a, auto& b) { at::add_out(o, a, b); }, [](auto& o, auto& b) { o.add_(b); });
      if (op.op_ == R::AVG) out.div_(n);
      return;
    case R::PRODUCT:
      fold([](auto& o, auto& a, auto& b) { at::mul_out(o, a, b); }, [](auto& o, auto& b) { o.mul_(b); });
      return;
    case R::MIN:
      fold([](auto& o, auto& a, auto& b) { at::minimum_out(o, a, b); },
           [](auto& o, auto& b) { at::minimum_out(o, o, b); });
      return;
    case R::MAX:
      fold([](auto& o, auto& a, auto& b) { at::maximum_out(o, a, b); },
           [](auto& o, auto& b) { at::maximum_out(o, o, b); });
      return;
    case R::BAND:
      fold([](auto& o, auto& a, auto& b) { at::bitwise_and_out(o, a, b); }, [](auto& o, auto& b) { o.bitwise_and_(b); });
      return;
    case R::BOR:
      fold([](auto& o, auto& a, auto& b) { at::bitwise_or_out(o, a, b); }, [](auto& o, auto& b) { o.bitwise_or_(b); });
      return;
    case R::BXOR:
      fold([](auto& o, auto& a, auto& b) { at::bitwise_xor_out(o, a, b); }, [](auto& o, auto& b) { o.bitwise_xor_(b); });
      return;
    default:
      TORCH_CHECK(false, "dlop allreduce: no device kernel for ReduceOp ", static_cast<int>(op.op_));
  }
}

}  // namespace

SharedDeviceArena::SharedDeviceArena(c10::Device device, int rank, std::vector<at::Tensor> slabs,
                                     std::size_t slot_bytes, std::weak_ptr<sched::Communicator> comm)
    : comm_(std::move(comm)),
      device_(device),
      rank_(rank),
      slot_bytes_(slot_bytes),
      to_slot_(internal_streams(device).into_shared),
      to_caller_(internal_streams(device).to_device),
      slabs_(std::move(slabs)) {
  DLOP_CHECK_ARG(slabs_.size() >= 2 && rank_ >= 0 && static_cast<std::size_t>(rank_) < slabs_.size(),
                 "dlop: shared device memory for rank ", rank_, " of ", slabs_.size());
  for (std::size_t r = 0; r < slabs_.size(); ++r) {
    const auto& s = slabs_[r];
    DLOP_CHECK_ARG(s.device() == device_ && s.scalar_type() == at::kByte && s.is_contiguous() &&
                       static_cast<std::size_t>(s.numel()) >= 2 * slot_bytes_,
                   "dlop: rank ", r, "'s shared device memory is not ", 2 * slot_bytes_, " contiguous bytes on ",
                   device_.str(), " (", s.numel(), " ", s.scalar_type(), " on ", s.device().str(), ")");
  }
}

bool SharedDeviceArena::serves(const std::vector<at::Tensor>& tensors, const c10d::ReduceOp& op) const {
  using R = c10d::ReduceOp::RedOpType;
  if (tensors.size() != 1) return false;
  const auto& t = tensors[0];
  const bool floating = at::isFloatingType(t.scalar_type());
  const bool bitwise = op.op_ == R::BAND || op.op_ == R::BOR || op.op_ == R::BXOR;
  if (!t.defined() || t.device() != device_ || t.layout() != at::kStrided || t.numel() == 0 ||
      !served_dtype(t.scalar_type(), bitwise) || static_cast<std::size_t>(t.element_size()) > slot_bytes_ ||
      op.op_ == R::UNUSED || (op.op_ == R::AVG && !floating)) {
    return false;
  }
  std::lock_guard lock(mutex_);
  return !released_;
}

bool SharedDeviceArena::serving() const {
  std::lock_guard lock(mutex_);
  return !released_;
}

c10::intrusive_ptr<c10d::Work> SharedDeviceArena::allreduce(ProcessGroupDlop& pg, at::Tensor& tensor,
                                                            const c10d::AllreduceOptions& opts) {
  try {
    return start_allreduce(pg, tensor, opts);
  } catch (const std::exception& e) {
    release(std::string("dlop allreduce in shared device memory failed: ") + e.what());
    throw;
  }
}

c10::intrusive_ptr<c10d::Work> SharedDeviceArena::start_allreduce(ProcessGroupDlop& pg, at::Tensor& tensor,
                                                                  const c10d::AllreduceOptions& opts) {
  const auto factor = premul_factor(opts.reduceOp, tensor);
  DeviceCall call(device_);
  // Reduced in place, or in a contiguous copy (made on the caller's stream).
  const auto whole = tensor.is_contiguous() ? tensor : tensor.contiguous();
  // The copies in follow the caller's queued work, whenever they are queued.
  auto after_caller = std::make_shared<c10::Event>(device_.type());
  after_caller->record(c10::impl::VirtualGuardImpl(device_.type()).getStream(device_));
  const auto flat = whole.view(-1);
  const int64_t total = flat.numel();
  const int64_t per_slot = static_cast<int64_t>(slot_bytes_) / tensor.element_size();
  auto self = shared_from_this();
  std::vector<WorkDevice::Step> steps;
  for (int64_t offset = 0, index = 0; offset < total; offset += per_slot, ++index) {
    const int64_t n = std::min(per_slot, total - offset);
    auto chunk = std::make_shared<Chunk>();
    chunk->source = flat.narrow(0, offset, n);
    chunk->dest = chunk->source;
    chunk->factor = factor;
    chunk->op = opts.reduceOp;
    chunk->after_caller = after_caller;
    chunk->total = total;
    chunk->index = index;
    if (offset + n == total && !whole.is_same(tensor)) {
      chunk->result = whole;
      chunk->caller = tensor;
    }
    {
      std::lock_guard lock(mutex_);
      chunk->seq = next_seq_++;
      const bool previous_reduced = reduced_ >= chunk->seq;
      chunk->gate = std::make_shared<HostSignal>(
          previous_reduced ? 1 : 2, "the copy of shared-device chunk " + std::to_string(chunk->seq) +
                                        " into device memory, and the reduce of the chunk before it");
      if (released_) chunk->gate->open();
      chunks_[chunk->seq] = chunk;
      if (!released_ && barriers_done_ >= chunk->seq) copy_in(*chunk);
    }
    auto agreed = agreement(n, total, index, tensor, opts.reduceOp);
    c10d::AllreduceOptions barrier;
    barrier.reduceOp = c10d::ReduceOp::MAX;
    barrier.timeout = opts.timeout;
    c10::intrusive_ptr<c10d::Work> host;
    {
      const DeviceScope scope(chunk->gate);
      std::vector<at::Tensor> agreed_list{agreed};
      host = pg.host_allreduce(agreed_list, barrier);
    }
    WorkDevice::Step step{std::move(host), {}, {}};
    step.then = [self, seq = chunk->seq, agreed](std::exception_ptr error) {
      try {
        if (error) std::rethrow_exception(error);
        self->barrier_done(seq, agreed);
      } catch (const std::exception& e) {
        self->release(e.what());
        throw;
      }
    };
    steps.push_back(std::move(step));
  }
  call.buffers()->tensors.push_back(tensor);
  call.buffers()->tensors.push_back(whole);
  auto work = c10::make_intrusive<WorkDevice>(pg.getRank(), c10d::OpType::ALLREDUCE, call, std::vector<at::Tensor>{tensor});
  work->start(std::move(steps));
  return work;
}

// With mutex_ held.
void SharedDeviceArena::copy_in(Chunk& chunk) {
  chunk.copy_queued = true;
  const auto slot = static_cast<int64_t>(chunk.seq % 2);
  const auto bytes = chunk.source.numel() * chunk.source.element_size();
  auto mine = slabs_[static_cast<std::size_t>(rank_)]
                  .narrow(0, slot * static_cast<int64_t>(slot_bytes_), bytes)
                  .view(chunk.source.scalar_type());
  const c10::StreamGuard guard(to_slot_);
  const at::AutoDispatchBelowADInplaceOrView data_only;  // a Parameter all-reduced: data, not a graph
  chunk.after_caller->block(to_slot_);
  if (chunk.factor) {
    at::mul_out(mine, chunk.source, *chunk.factor);
  } else {
    mine.copy_(chunk.source, /*non_blocking=*/true);
  }
  auto passed = std::make_shared<c10::Event>(device_.type());
  passed->record(to_slot_);
  when_passed(to_slot_, std::move(passed), [self = shared_from_this(), seq = chunk.seq] { self->copied_in(seq); });
}

void SharedDeviceArena::copied_in(std::uint64_t seq) {
  std::shared_ptr<HostSignal> gate;
  {
    std::lock_guard lock(mutex_);
    const auto it = chunks_.find(seq);
    if (it != chunks_.end()) gate = it->second->gate;
  }
  if (gate) gate->arrive();
}

void SharedDeviceArena::barrier_done(std::uint64_t seq, const at::Tensor& agreed) {
  std::unique_lock lock(mutex_);
  const auto it = chunks_.find(seq);
  DLOP_CHECK_ARG(!released_ && it != chunks_.end(),
                 "dlop allreduce: the group stopped reducing in shared device memory (an earlier all-reduce there failed, or the group was shut down)");
  auto& chunk = *it->second;
  const auto* a = agreed.data_ptr<int64_t>();
  const auto count = chunk.source.numel();
  bool same = true;
  for (int i = 0; i < kAgreed; ++i) same = same && a[2 * i] == -a[2 * i + 1];
  // Thrown on every rank alike (they all see the same figures); the caller
  // (`then`) then aborts the group.
  DLOP_CHECK_ARG(same, "dlop allreduce: ranks passed different tensors (", -a[3], " to ", a[2],
                 " elements; dtypes ", static_cast<c10::ScalarType>(-a[7]), " to ", static_cast<c10::ScalarType>(a[6]),
                 ", ReduceOps ", -a[9], " to ", a[8], "; this rank: ", chunk.total, " ", chunk.source.scalar_type(),
                 ")");
  const auto slot = static_cast<int64_t>(seq % 2);
  std::vector<at::Tensor> views;
  for (const auto& slab : slabs_) {
    views.push_back(slab.narrow(0, slot * static_cast<int64_t>(slot_bytes_), count * chunk.source.element_size())
                        .view(chunk.source.scalar_type()));
  }
  {
    const c10::StreamGuard guard(to_caller_);
    const at::AutoDispatchBelowADInplaceOrView data_only;
    combine(chunk.dest, views, chunk.op);
    if (chunk.caller.defined()) chunk.caller.copy_(chunk.result);
    auto passed = std::make_shared<c10::Event>(device_.type());
    passed->record(to_caller_);
    when_passed(to_caller_, std::move(passed), [self = shared_from_this(), seq] { self->reduced(seq); });
  }
  barriers_done_ = seq + 1;
  const auto next = chunks_.find(seq + 1);
  if (next != chunks_.end() && !next->second->copy_queued) copy_in(*next->second);
}

void SharedDeviceArena::reduced(std::uint64_t seq) {
  std::shared_ptr<HostSignal> gate;
  {
    std::lock_guard lock(mutex_);
    reduced_ = seq + 1;
    chunks_.erase(seq);
    const auto next = chunks_.find(seq + 1);
    if (next != chunks_.end()) gate = next->second->gate;
  }
  if (gate) gate->arrive();
}

void SharedDeviceArena::release(const std::string& why) {
  const auto comm = comm_.lock();
  // First: the barriers still queued, opened below, then fail at once.
  if (!why.empty() && comm) comm->abort(why);
  std::vector<std::shared_ptr<HostSignal>> gates;
  auto drained = std::make_shared<HostSignal>(1, "the last reduce of rank " + std::to_string(rank_) +
                                                     " in shared device memory on " + device_.str());
  std::shared_ptr<at::Tensor> own;
  {
    std::lock_guard lock(mutex_);
    if (released_) return;
    released_ = true;
    for (auto& [seq, chunk] : chunks_) gates.push_back(chunk->gate);
    chunks_.clear();
    own = std::make_shared<at::Tensor>(std::move(slabs_[static_cast<std::size_t>(rank_)]));
    // The peers' memory goes once what this rank queued on it has run: the
    // copies in, then the reduces; its own waits for the last barrier too.
    auto peers = std::make_shared<std::vector<at::Tensor>>(std::move(slabs_));
    slabs_.clear();
    auto copies = std::make_shared<c10::Event>(device_.type());
    copies->record(to_slot_);
    auto reduces = std::make_shared<c10::Event>(device_.type());
    reduces->record(to_caller_);
    when_passed(to_slot_, std::move(copies), [to_caller = to_caller_, reduces, peers, drained]() mutable {
      when_passed(to_caller, std::move(reduces), [peers, drained] {
        peers->clear();
        drained->arrive();
      });
    });
  }
  // The barriers still queued start now: on an aborted group they fail at
  // once (at shutdown, the group is going); none of them reduces any more.
  for (auto& gate : gates) gate->open();
  let_go_of_own(std::move(drained), std::move(own), why);
}

namespace {

// Memory a peer may still read: never freed, never reused.
void keep_for_good(std::shared_ptr<at::Tensor> own, const std::string& why) {
  static std::mutex mutex;
  static auto* kept = new std::vector<std::shared_ptr<at::Tensor>>();  // leaked on purpose, as what it holds
  const auto bytes = own->defined() ? own->nbytes() : 0;
  const auto device = own->defined() ? own->device().str() : std::string("?");
  {
    std::lock_guard lock(mutex);
    kept->push_back(std::move(own));
  }
  log().warn("dlop: this rank keeps its {} bytes of shared device memory on {} unused until it exits: a peer may "
             "still read them, and no barrier said otherwise ({})",
             bytes, device, why);
}

}  // namespace

void SharedDeviceArena::let_go_of_own(std::shared_ptr<HostSignal> drained, std::shared_ptr<at::Tensor> own,
                                      const std::string& why) {
  const auto comm = comm_.lock();
  if (!why.empty() || !comm) {
    keep_for_good(std::move(own), why.empty() ? "the group was gone" : why);
    return;
  }
  // Waited for here, not in a callback: the engine stops with the group
  // (cancelling what is left), and the memory must outlive every peer's reads.
  sched::OpOptions options;
  options.ready = std::move(drained);
  try {
    comm->barrier(std::move(options)).wait();
  } catch (const std::exception& e) {
    keep_for_good(std::move(own), std::string("the last barrier failed: ") + e.what());
    return;
  }
  own.reset();  // every rank has read it
}

}  // namespace dlop::backend
