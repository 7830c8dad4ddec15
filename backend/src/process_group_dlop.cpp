// ProcessGroupDlop: construction, Work plumbing, point to point, barriers.
// The collectives are in process_group_collectives.cpp.
#include "backend/process_group_dlop.hpp"

#include <algorithm>
#include <utility>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "backend/torch_error.hpp"
#include "c10d_store.hpp"
#include "collective.hpp"
#include "delegation.hpp"
#include "core/error.hpp"
#include "core/log.hpp"
#include "device_staging.hpp"
#include "shared_device.hpp"
#include "tensor_args.hpp"
#include "transport/session.hpp"
#include "backend/work_dlop.hpp"
#include "world_registry.hpp"

namespace dlop::backend {
namespace {

// torch's p2p tags are non-negative ints; tags from 2^31 on are dlop's own.
constexpr std::uint32_t kMonitoredBarrierTag = 0x80000001u;

void check_tag(int tag, std::string_view op) {
  TORCH_CHECK_VALUE(tag >= 0, "dlop ", op, ": tag must be non-negative, got ", tag);
}

}  // namespace

ProcessGroupDlop::ProcessGroupDlop(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                   std::chrono::milliseconds timeout, std::vector<int> global_ranks,
                                   std::string group_name, bool own_engine)
    : c10d::Backend(rank, size), timeout_(timeout), group_name_(std::move(group_name)) {
  TORCH_CHECK_VALUE(size > 0 && rank >= 0 && rank < size, "dlop: rank ", rank, " of a group of ", size);
  TORCH_CHECK_VALUE(global_ranks.empty() || global_ranks.size() == static_cast<std::size_t>(size), "dlop: group of ",
                    size, " ranks with ", global_ranks.size(), " global ranks");
  auto wire_store = std::make_shared<C10dStore>(store);
  sched::Communicator::Options options;
  options.timeout = timeout;
  try {
    namespace_ = "dlop/" + transport::agree_session(*wire_store, "dlop", rank, size, timeout);
    bootstrap_ = std::make_shared<transport::Bootstrap>(wire_store, rank, size, namespace_);
    auto group = own_engine ? GroupCommunicator{sched::Communicator::create(*bootstrap_, options), bootstrap_}
                            : make_group_communicator(bootstrap_, global_ranks, options);
    engine_bootstrap_ = std::move(group.engine_bootstrap);
    comm_ = std::move(group.comm);
  } catch (...) {
    std::rethrow_exception(to_torch_error(std::current_exception()));
  }
  completions_ = shared_completion_queue();
  if (!own_engine) {
    faults_ = group_fault_channel(global_ranks.empty() ? store : c10::intrusive_ptr<c10d::Store>(), rank,
                                  namespace_ + "/peer_dead");
  }
  if (faults_) faults_->watch(comm_);
  log().debug("process group '{}': rank {} of {}, {} host(s)", group_name_, rank, size, comm_->hosts());
}

ProcessGroupDlop::~ProcessGroupDlop() { shutdown(); }

void ProcessGroupDlop::abort() {
  if (comm_) comm_->abort("the process group was aborted");
  // Aborted, not shut down after: NCCL's abort already ends what its shutdown would.
  if (auto delegate = std::exchange(delegate_, {})) delegate->abort();
  shutdown();
}

void ProcessGroupDlop::shutdown() {
  // Pending operations keep the engine (and the Works their tensors) alive
  // until they finish or time out; the completion thread stops once the
  // last group lets go of it.
  {
    std::unique_lock lock(sharing_mutex_);
    auto sharer = std::exchange(sharer_, {});
    auto arena = std::exchange(shared_device_, {});
    lock.unlock();
    if (arena) arena->release();
  }
  faults_.reset();
  completions_.reset();
  comm_.reset();
  // Now rather than when its last reference goes: NCCL's communicators and
  // watchdog end with the group that torch shuts down.
  if (auto delegate = std::exchange(delegate_, {})) delegate->shutdown();
}

#if DLOP_TORCH_AT_LEAST(2, 9)
void ProcessGroupDlop::setTimeout(std::chrono::milliseconds timeout) {
  timeout_ = timeout;
  if (delegate_) delegate_->setTimeout(timeout);
}

std::shared_ptr<c10::Allocator> ProcessGroupDlop::getMemAllocator() {
  TORCH_CHECK(delegate_ != nullptr, "dlop: getMemAllocator needs a device backend to delegate to (",
              delegate_name_.empty() ? "none: the accelerator tensors of this group are staged" : "shut down", ")");
  return delegate_->getMemAllocator();
}

void ProcessGroupDlop::setGroupUid(const std::string& pg_uid) {
  c10d::Backend::setGroupUid(pg_uid);
  // torch names the group once per device type it serves: connect once.
  if (const auto bound = getBoundDeviceId(); bound && !eager_connected_) eagerConnectSingleDevice(*bound);
}
#endif

void ProcessGroupDlop::eagerConnectSingleDevice(at::Device device) {
  eager_connected_ = true;
  // dlop's own engine connected when the group was made.
  if (!delegate_ || std::find(delegate_types_.begin(), delegate_types_.end(), device.type()) == delegate_types_.end()) {
    return;
  }
  // NCCL also runs its barrier() and finds its device by the bound device.
  if (device.has_index()) delegate_->setBoundDeviceId(device);
  delegate_->eagerConnectSingleDevice(device);
}

void ProcessGroupDlop::registerOnCompletionHook(std::function<void(std::shared_ptr<c10d::WorkInfo>)>&& hook) {
  TORCH_CHECK(delegate_ != nullptr, "dlop: registerOnCompletionHook needs a device backend to delegate to "
              "(the hook sees the delegated calls only); this group has none");
  delegate_->registerOnCompletionHook(std::move(hook));
}

sched::OpOptions ProcessGroupDlop::op_options(std::chrono::milliseconds timeout) const {
  TORCH_CHECK(comm_ != nullptr, "dlop: the process group has been shut down");
  sched::OpOptions options;
  options.timeout = timeout.count() > 0 ? timeout : timeout_;
  // DDP's reducer (and its default comm hook) all-reduce gradient buckets
  // through allreduce() with nothing that tells them apart from other calls
  // (c10d's AllreduceOptions carries no tag): every collective of a process
  // group is gradient traffic, the class the training step waits on.
  options.traffic = sched::TrafficClass::kGradient;
  options.ready = DeviceScope::ready();  // staged device buffers: start once copied out
  return options;
}

void ProcessGroupDlop::set_device_backend(c10::intrusive_ptr<c10d::Backend> delegate, std::string name,
                                          std::vector<c10::DeviceType> device_types, bool stage_others) {
  delegate_ = std::move(delegate);
  delegate_name_ = std::move(name);
  delegate_types_ = std::move(device_types);
  stage_others_ = stage_others;
}

void ProcessGroupDlop::share_device_when_used(DeviceSharer sharer) {
  std::lock_guard lock(sharing_mutex_);
  sharer_ = std::move(sharer);
}

std::shared_ptr<SharedDeviceArena> ProcessGroupDlop::shared_device(c10::Device device) {
  std::unique_lock lock(sharing_mutex_);
  sharing_done_.wait(lock, [&] { return !sharing_; });
  if (sharer_) {
    // Asked outside the lock: it takes the GIL and waits on the store, and a
    // thread holding the GIL may want the lock meanwhile.
    auto sharer = std::exchange(sharer_, {});
    sharing_ = true;
    lock.unlock();
    std::variant<DeviceMemory, std::string> answer;
    try {
      answer = sharer(device);
    } catch (...) {
      // Asked again at the next call (DLOP_DEVICE_BACKEND=shared refuses every one).
      lock.lock();
      sharer_ = std::move(sharer);
      sharing_ = false;
      sharing_done_.notify_all();
      throw;
    }
    sharer = {};
    lock.lock();
    sharing_ = false;
    sharing_done_.notify_all();
    if (auto* memory = std::get_if<DeviceMemory>(&answer)) {
      DLOP_CHECK_ARG(static_cast<int>(memory->slabs.size()) == getSize(), "dlop: shared device memory of ",
                     memory->slabs.size(), " ranks for a group of ", getSize());
      shared_device_ = std::make_shared<SharedDeviceArena>(memory->slabs.at(0).device(), getRank(),
                                                           std::move(memory->slabs), memory->slot_bytes, comm_);
    }
  }
  if (!shared_device_ || shared_device_->device() != device) return nullptr;
  return shared_device_;
}

std::optional<c10::Device> ProcessGroupDlop::shared_device_in_use() const {
  std::lock_guard lock(sharing_mutex_);
  if (!shared_device_ || !shared_device_->serving()) return std::nullopt;
  return shared_device_->device();
}

bool ProcessGroupDlop::delegates(c10::Device device, const char* op) const {
  if (delegate_ && std::find(delegate_types_.begin(), delegate_types_.end(), device.type()) != delegate_types_.end()) {
    return true;
  }
  DLOP_CHECK_ARG(stage_others_ || device.is_cpu(), "dlop ", op, ": DLOP_DEVICE_BACKEND=", delegate_name_,
                 " sends accelerator tensors to backend ", delegate_name_, ", which cannot serve tensors on ",
                 device.str(), "; set DLOP_DEVICE_BACKEND=staged (or auto) to stage them through host memory");
  return false;
}

void ProcessGroupDlop::track_delegated(const c10::intrusive_ptr<c10d::Work>& work, c10::Device device) {
  if (comm_) count_until_done(work, device, comm_->data_credits());
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDlop::make_work(c10d::OpType type, std::vector<sched::Handle> handles,
                                                           std::vector<at::Tensor> outputs,
                                                           std::vector<at::Tensor> keep_alive,
                                                           std::function<void()> finish, bool caller_waits) {
  auto work = c10::make_intrusive<WorkDlop>(getRank(), type, std::move(outputs), std::move(keep_alive),
                                            std::move(finish));
  work->report_peer_deaths_to(faults_);
  if (caller_waits) {
    work->complete_in_place(std::move(handles), completions_);
  } else {
    work->attach(std::move(handles), completions_);
  }
  return work;
}

void ProcessGroupDlop::issued(const WorkPtr& work) {
  const auto type = work->retrieveOpType();
  if (type != c10d::OpType::SEND && type != c10d::OpType::RECV && type != c10d::OpType::RECVANYSOURCE) {
    ++collectives_issued_;
  }
  if (coalescing_ == Coalescing::kOwn) coalesced_.push_back(work);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDlop::barrier(const c10d::BarrierOptions& opts) {
  auto options = op_options(opts.timeout);
  options.caller_waits = caller_waits(opts);
  auto work = make_work(c10d::OpType::BARRIER, {comm_->barrier(options)}, {}, {}, {}, options.caller_waits);
  issued(work);
  return work;
}

void ProcessGroupDlop::monitoredBarrier(const c10d::BarrierOptions& opts, bool wait_all_ranks) {
  auto options = op_options(opts.timeout);
  // As with Gloo, only kUnsetTimeout means the group's timeout: an explicit 0
  // is a limit that has already expired.
  const auto timeout = opts.timeout == c10d::kUnsetTimeout ? *options.timeout : opts.timeout;
  const auto start = std::chrono::steady_clock::now();
  std::uint8_t token = 1;
  const auto passed = [&](const sched::Handle& handle, std::chrono::milliseconds limit) {
    try {
      handle.wait(std::max(limit, std::chrono::milliseconds(0)));
      return true;
    } catch (const Error&) {
      return false;
    }
  };
  if (getRank() != 0) {
    auto sent = comm_->send(&token, 1, coll::DataType::kUInt8, 0, kMonitoredBarrierTag, options);
    std::uint8_t ack = 0;
    auto acked = comm_->recv(&ack, 1, coll::DataType::kUInt8, 0, kMonitoredBarrierTag, options);
    // Worded as Gloo's, which scripts and torch's tests match.
    TORCH_CHECK(passed(sent, timeout) && passed(acked, timeout), "[Rank ", getRank(), "]: Rank ", getRank(),
                " successfully reached monitoredBarrier, but received errors while waiting for send/recv from rank 0"
                " (it did not release the barrier within ",
                timeout.count(), " ms)");
    return;
  }
  std::vector<std::uint8_t> tokens(static_cast<std::size_t>(getSize()));
  std::vector<sched::Handle> arrivals(static_cast<std::size_t>(getSize()));
  for (int r = 1; r < getSize(); ++r) {
    arrivals[r] = comm_->recv(&tokens[r], 1, coll::DataType::kUInt8, r, kMonitoredBarrierTag, options);
  }
  std::vector<int> missing;
  for (int r = 1; r < getSize(); ++r) {
    // Reporting the first missing rank, rank 0 shares one deadline among them
    // and, once it is spent, reports itself (as Gloo words it); reporting all
    // of them, each rank gets the whole timeout.
    const auto left = timeout - std::chrono::duration_cast<std::chrono::milliseconds>(
                                    std::chrono::steady_clock::now() - start);
    TORCH_CHECK(wait_all_ranks || left.count() > 0, "Rank 0 timed out in monitoredBarrier after ", timeout.count(),
                " ms");
    if (passed(arrivals[r], wait_all_ranks ? timeout : left)) continue;
    missing.push_back(r);
    TORCH_CHECK(wait_all_ranks, "[Rank 0]: Rank ", r, " failed to pass monitoredBarrier in ", timeout.count(), " ms");
  }
  TORCH_CHECK(missing.empty(), "[Rank 0]: Ranks ", fmt::format("{}", fmt::join(missing, ", ")),
              " failed to pass monitoredBarrier in ", timeout.count(), " ms");
  std::vector<sched::Handle> acks;
  for (int r = 1; r < getSize(); ++r) {
    acks.push_back(comm_->send(&token, 1, coll::DataType::kUInt8, r, kMonitoredBarrierTag, options));
  }
  for (const auto& ack : acks) ack.wait();
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDlop::send(std::vector<at::Tensor>& tensors, int dst_rank, int tag) {
  std::vector<at::Tensor> none;
  return collective(c10d::OpType::SEND, "send", none, tensors,
                    [&](c10d::Backend& b, auto&, auto& in) { return b.send(in, dst_rank, tag); },
                    [&](auto&, auto& in) { return point_to_point(c10d::OpType::SEND, in, dst_rank, tag); });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDlop::recv(std::vector<at::Tensor>& tensors, int src_rank, int tag) {
  std::vector<at::Tensor> none;
  return collective(c10d::OpType::RECV, "recv", tensors, none,
                    [&](c10d::Backend& b, auto& out, auto&) { return b.recv(out, src_rank, tag); },
                    [&](auto& out, auto&) { return point_to_point(c10d::OpType::RECV, out, src_rank, tag); });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDlop::recvAnysource(std::vector<at::Tensor>& tensors, int tag) {
  std::vector<at::Tensor> none;
  return collective(c10d::OpType::RECVANYSOURCE, "recv", tensors, none,
                    [&](c10d::Backend& b, auto& out, auto&) { return b.recvAnysource(out, tag); },
                    [&](auto& out, auto&) { return point_to_point(c10d::OpType::RECVANYSOURCE, out, -1, tag); });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDlop::point_to_point(c10d::OpType type, std::vector<at::Tensor>& tensors,
                                                                int peer, int tag) {
  const bool sending = type == c10d::OpType::SEND;
  const char* op = sending ? "send" : "recv";
  const auto& tensor = single_tensor(tensors, op);
  check_tag(tag, op);
  TORCH_CHECK_VALUE(type == c10d::OpType::RECVANYSOURCE || (peer >= 0 && peer < getSize()), "dlop ", op,
                    ": invalid ", sending ? "destination" : "source", " rank ", peer, " for a group of ", getSize());
  auto stage = staged(tensor);
  const auto view = byte_view(stage);
  const auto options = op_options(timeout_);
  const auto wire_tag = static_cast<std::uint32_t>(tag);
  auto handle = sending ? comm_->send(view.data, view.count, view.dtype, peer, wire_tag, options)
                        : comm_->recv(view.data, view.count, view.dtype, peer, wire_tag, options);
  if (sending) return make_work(type, {std::move(handle)}, {}, {tensor, stage});
  return make_work(type, {std::move(handle)}, {tensor}, {stage}, [tensor, stage] { copy_back(tensor, stage); });
}

}  // namespace dlop::backend
