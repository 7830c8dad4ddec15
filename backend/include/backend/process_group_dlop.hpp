// ProcessGroupDlop: torch.distributed's c10d::Backend over dlop's engine.
//
// Tensors become the engine's buffer views (tensor_args.hpp); every operation
// is submitted at once and returns a WorkDlop whose future completes with the
// output tensors. The inputs and outputs stay referenced by the Work until the
// engine is done with them.
#pragma once

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <atomic>
#include <chrono>
#include <memory>
#include <optional>
#include <variant>
#include <condition_variable>
#include <mutex>
#include <functional>
#include <string>
#include <vector>

#include "backend/torch_version.hpp"
#include "scheduler/communicator.hpp"
#include "transport/bootstrap.hpp"

// Backend virtuals that older torch does not have: there dlop's member is a
// plain function (torch never calls it; ~ProcessGroupDlop still shuts down).
#if DLOP_TORCH_AT_LEAST(2, 7)
#define DLOP_OVERRIDE_SINCE_TORCH_2_7 override  // Backend::abort, Backend::shutdown
#else
#define DLOP_OVERRIDE_SINCE_TORCH_2_7
#endif

namespace dlop::backend {

namespace on_device {
struct Staged;
}
class CompletionQueue;
class FaultChannel;
class SharedDeviceArena;
class WorkDlop;

class ProcessGroupDlop : public c10d::Backend {
 public:
  // store: the group's c10d store (torch passes a PrefixStore per group).
  // global_ranks: the group's ranks in the default group, empty for the
  // default group itself; a sub-group then shares the default group's engine.
  // own_engine: a group apart from the process's groups (torchft's, remade on
  // every quorum change): an engine of its own, neither the default group
  // nor a sub-group of it, and no fault channel.
  ProcessGroupDlop(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                   std::chrono::milliseconds timeout, std::vector<int> global_ranks = {},
                   std::string group_name = {}, bool own_engine = false);
  ~ProcessGroupDlop() override;

  const std::string getBackendName() const override { return "dlop"; }
#if DLOP_TORCH_AT_LEAST(2, 9)
  // ProcessGroup.set_timeout (torch >= 2.9): dlop's and the delegate's.
  void setTimeout(std::chrono::milliseconds timeout) override;
  // Coalescing is what batch_isend_irecv needs of NCCL (its p2p calls would
  // wait on each other one by one): offered where the delegate offers it.
  bool supportsCoalescing() const override { return delegate_ && delegate_->supportsCoalescing(); }
  // The delegate's (NCCL's memory pool); dlop has none of its own.
  std::shared_ptr<c10::Allocator> getMemAllocator() override;
  // torch names a group after setting its bound device (init_process_group's
  // or new_group's device_id): the one moment dlop learns it, so the
  // delegate connects here, as torch connects NCCL groups eagerly.
  void setGroupUid(const std::string& pg_uid) override;
#endif
  // Between the two, calls go to one place, chosen by the first: the
  // delegate (then its own startCoalescing and endCoalescing) or dlop, whose
  // endCoalescing returns a Work over its calls (CPU tensors only).
  void startCoalescing() override;
  c10::intrusive_ptr<c10d::Work> endCoalescing() override;
  // Binds the delegate serving `device` to it and connects it now.
  void eagerConnectSingleDevice(at::Device device) override;
  // The hook sees the delegated calls only: dlop's own Works report to none.
  void registerOnCompletionHook(std::function<void(std::shared_ptr<c10d::WorkInfo>)>&& hook) override;

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                     const c10d::AllreduceCoalescedOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors, const c10d::ReduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                     std::vector<at::Tensor>& inputs,
                                                     const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                 std::vector<at::Tensor>& inputs,
                                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                        std::vector<at::Tensor>& inputs, const c10d::GatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                         std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                      const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                 std::vector<at::Tensor>& inputs,
                                                                 const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& output_split_sizes,
                                               std::vector<int64_t>& input_split_sizes,
                                               const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts) override;
  void monitoredBarrier(const c10d::BarrierOptions& opts, bool wait_all_ranks) override;
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst_rank, int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src_rank, int tag) override;
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override;

  void abort() DLOP_OVERRIDE_SINCE_TORCH_2_7;
  void shutdown() DLOP_OVERRIDE_SINCE_TORCH_2_7;

  // TORCH_DISTRIBUTED_DEBUG=DETAIL wraps each group in torch's
  // ProcessGroupWrapper, which compares this number across the ranks before
  // every collective: the count of collectives (not p2p) issued so far. Every
  // rank starts at 0, as Gloo's do.
  void setSequenceNumberForGroup() override {}
  uint64_t getSequenceNumberForGroup() override { return collectives_issued_.load(); }

  sched::Communicator& communicator() { return *comm_; }
  // This attempt's namespace of the group's store, "dlop/<session id>"
  // (transport/session.hpp): dlop's keys, and its delegate's, go under it so
  // that nothing an earlier attempt left in a long-lived store is read.
  const std::string& store_namespace() const { return namespace_; }

  // Hands the calls on tensors of `device_types` to `delegate`, a backend
  // made for the same ranks (ProcessGroupNCCL for CUDA where each rank has
  // its own GPU; made in Python, python/dlop/_backend.py, so that dlop needs
  // no device library's headers). The engine still counts each delegated
  // call as gradient traffic in its data credits until it completes. With
  // `stage_others` false, accelerator tensors the delegate does not serve
  // are refused instead of staged (DLOP_DEVICE_BACKEND names one backend).
  void set_device_backend(c10::intrusive_ptr<c10d::Backend> delegate, std::string name,
                          std::vector<c10::DeviceType> device_types, bool stage_others);
  // The delegate, null when there is none (or after shutdown).
  const c10::intrusive_ptr<c10d::Backend>& device_backend() const { return delegate_; }
  // Where the group's ranks may share one device: `sharer` is asked once, at
  // the first all-reduce on a device, on the caller's thread (every rank
  // makes that call, so it may talk to the other ranks: it exchanges the
  // device memory handles through the store, python/dlop/_shared_device.py).
  // It answers every rank's buffer of 2 * slot_bytes on that device (this
  // rank's own, the others mapped), or why the group stages instead. The
  // group's all-reduces on that device then reduce in its memory
  // (shared_device.hpp).
  struct DeviceMemory {
    std::vector<at::Tensor> slabs;
    std::size_t slot_bytes = 0;
  };
  using DeviceSharer = std::function<std::variant<DeviceMemory, std::string>(c10::Device)>;
  void share_device_when_used(DeviceSharer sharer);
  // The arena for all-reduces on `device`; null where they are staged.
  std::shared_ptr<SharedDeviceArena> shared_device(c10::Device device);
  std::optional<c10::Device> shared_device_in_use() const;

 private:
  // The staged path's ways in (staged_ops.hpp, shared_device.hpp): host_*.
  friend struct on_device::Staged;
  friend class SharedDeviceArena;

  // Every call on tensors (collective.hpp): it finds the call's device
  // (call_device), hands the call to the delegate where one serves that
  // device, stages accelerator tensors through host memory, and otherwise
  // runs `host(outputs, inputs)`, dlop's own implementation; the Work it
  // returns is the one the group counts (issued). `op(backend, outputs,
  // inputs)` is the call itself, for the delegate. The staging
  // (on_device::staged_call, whose Work is of `type`) runs `host` on host
  // copies, unless the call brings `staged(device)`, a staging of its own.
  template <class Out, class In, class Op, class Host>
  c10::intrusive_ptr<c10d::Work> collective(c10d::OpType type, const char* name, Out& outputs, In& inputs, Op&& op,
                                            Host&& host);
  template <class Out, class In, class Op, class Staged, class Host>
  c10::intrusive_ptr<c10d::Work> collective(c10d::OpType type, const char* name, Out& outputs, In& inputs, Op&& op,
                                            Staged&& staged, Host&& host);
  // The host entries: each call's implementation on host tensors (CPU
  // tensors, or a staged call's pinned copies), which checks them and
  // submits to the engine. The public call routes, counts and registers
  // the Work once; the staged path calls these directly, as NCCL's
  // collective() calls its `fn`, so it never enters a public call again.
  using WorkPtr = c10::intrusive_ptr<c10d::Work>;
  using Tensors = std::vector<at::Tensor>;
  using TensorLists = std::vector<std::vector<at::Tensor>>;
  WorkPtr host_allreduce(Tensors& tensors, const c10d::AllreduceOptions& opts);
  WorkPtr host_allreduce_coalesced(Tensors& tensors, const c10d::AllreduceCoalescedOptions& opts);
  WorkPtr host_broadcast(Tensors& tensors, const c10d::BroadcastOptions& opts);
  WorkPtr host_reduce(Tensors& tensors, const c10d::ReduceOptions& opts);
  WorkPtr host_allgather(TensorLists& outputs, Tensors& inputs, const c10d::AllgatherOptions& opts);
  WorkPtr host_allgather_base(at::Tensor& output, at::Tensor& input, const c10d::AllgatherOptions& opts);
  WorkPtr host_allgather_coalesced(TensorLists& outputs, Tensors& inputs, const c10d::AllgatherOptions& opts);
  WorkPtr host_allgather_into_tensor_coalesced(Tensors& outputs, Tensors& inputs, const c10d::AllgatherOptions& opts);
  WorkPtr host_gather(TensorLists& outputs, Tensors& inputs, const c10d::GatherOptions& opts);
  WorkPtr host_scatter(Tensors& outputs, TensorLists& inputs, const c10d::ScatterOptions& opts);
  WorkPtr host_reduce_scatter(Tensors& outputs, TensorLists& inputs, const c10d::ReduceScatterOptions& opts);
  WorkPtr host_reduce_scatter_base(at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts);
  WorkPtr host_reduce_scatter_tensor_coalesced(Tensors& outputs, Tensors& inputs,
                                               const c10d::ReduceScatterOptions& opts);
  WorkPtr host_alltoall_base(at::Tensor& output, at::Tensor& input, std::vector<int64_t>& output_split_sizes,
                             std::vector<int64_t>& input_split_sizes, const c10d::AllToAllOptions& opts);
  WorkPtr host_alltoall(Tensors& outputs, Tensors& inputs, const c10d::AllToAllOptions& opts);
  // A Work dlop ran itself, once per public call: a collective (not p2p)
  // moves the sequence number, and a coalesced group keeps it.
  void issued(const WorkPtr& work);
  // dlop's send, recv and recvAnysource (`type`) of CPU tensors; `peer` -1: any source.
  c10::intrusive_ptr<c10d::Work> point_to_point(c10d::OpType type, std::vector<at::Tensor>& tensors, int peer,
                                                int tag);
  sched::OpOptions op_options(std::chrono::milliseconds timeout) const;
  // Wraps submitted handles into a Work that completes with `outputs` after
  // running `finish` (copies back from staging buffers) on completion. With
  // `caller_waits` (a blocking call), the Work is complete when returned.
  // Neither counted nor registered: issued() does that for the public call.
  c10::intrusive_ptr<c10d::Work> make_work(c10d::OpType type, std::vector<sched::Handle> handles,
                                           std::vector<at::Tensor> outputs, std::vector<at::Tensor> keep_alive,
                                           std::function<void()> finish = {}, bool caller_waits = false);
  // The delegate's Work for a call on `device` (which may be null inside a
  // coalesced group), counted as gradient traffic; nullopt when dlop runs
  // the call itself.
  template <class Call>
  std::optional<c10::intrusive_ptr<c10d::Work>> delegated(c10::Device device, const char* op, Call&& call) {
    const bool to_delegate = (delegate_ || !stage_others_) && delegates(device, op);
    if (coalescing_ != Coalescing::kOff) route_coalesced(to_delegate, device, op);
    if (!to_delegate) return std::nullopt;
    auto work = call(*delegate_);
    // In a coalesced group, endCoalescing's Work is the one counted.
    if (work && coalescing_ == Coalescing::kOff) track_delegated(work, device);
    return work;
  }
  bool delegates(c10::Device device, const char* op) const;
  void track_delegated(const c10::intrusive_ptr<c10d::Work>& work, c10::Device device);
  // Coalescing (coalescing.cpp): where this call of the group goes.
  void route_coalesced(bool to_delegate, c10::Device device, const char* op);

  // Declared before comm_, so destroyed after it: the engine refers to the
  // bootstrap it was made with (the default group's, for a sub-group).
  std::shared_ptr<transport::Bootstrap> bootstrap_;
  std::shared_ptr<transport::Bootstrap> engine_bootstrap_;
  std::shared_ptr<sched::Communicator> comm_;
  std::shared_ptr<CompletionQueue> completions_;
  std::shared_ptr<FaultChannel> faults_;  // null for a group without a dlop default group
  std::atomic<uint64_t> collectives_issued_{0};
  std::chrono::milliseconds timeout_;
  std::string group_name_;
  std::string namespace_;
  c10::intrusive_ptr<c10d::Backend> delegate_;  // set once, before the first call
  std::string delegate_name_;
  mutable std::mutex sharing_mutex_;
  std::condition_variable sharing_done_;
  bool sharing_ = false;                              // sharing_mutex_: a caller is asking sharer_
  DeviceSharer sharer_;                               // sharing_mutex_: until asked
  std::shared_ptr<SharedDeviceArena> shared_device_;  // sharing_mutex_
  std::vector<c10::DeviceType> delegate_types_;
  bool stage_others_ = true;
  bool eager_connected_ = false;
  enum class Coalescing { kOff, kStarted, kDelegated, kOwn };
  Coalescing coalescing_ = Coalescing::kOff;
  c10::Device coalescing_device_{c10::DeviceType::CPU};
  std::vector<c10::intrusive_ptr<c10d::Work>> coalesced_;  // kOwn: dlop's Works of the group
};

}  // namespace dlop::backend
