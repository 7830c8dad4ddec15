// Ranks that share one accelerator reduce in its memory, not through the host.
//
// Each rank of the group holds one buffer of device memory in two slots, and
// maps every other rank's buffer (python/dlop/_shared_device.py exchanges the
// handles once, through the store). An all-reduce goes in chunks of a slot:
//   1. copy in: the caller's chunk into this rank's slot (premultiplied there
//      for PREMUL_SUM), on a stream of its own, after the caller's work;
//   2. a host barrier, a 10-number all-reduce on the engine that also checks
//      that every rank passed the same total and chunk count, chunk index,
//      dtype and operation (a mismatch aborts the group on every rank); it starts
//      once the copy in has passed and this rank's previous reduce has (the
//      stream's waiting thread says so; nothing polls);
//   3. the reduce: every rank's slot, in rank order, into the caller's chunk,
//      with the device's own kernels on the copy-back stream. Every rank sums
//      in the same order, so every rank gets the same bits.
// A slot is written again two chunks later, and only after the barrier of the
// chunk between, which no rank enters before its reduce of the slot has
// passed: no rank overwrites what another is still reading.
//
// What this path does not serve (other operations, empty tensors, dtypes or
// operations it has no kernel for: the same answer on every rank for the same
// call) is staged as before (staged_ops.hpp); a tensor that is not contiguous
// is reduced in a contiguous copy.
//
// Letting go: every rank's mapping of its peers' memory goes once its own
// queued work is done. Its own memory, which the peers map, goes only after a
// last barrier of the group that each rank enters once its last reduce has
// passed: until every rank has finished reading it, it stays out of the
// allocator's reuse (on a GPU the caching allocator would hand it to the next
// tensor while a peer's reduce still reads it). After a failure (the group is
// aborted), or if that barrier fails (a dead peer, the timeout), no rank can
// know that its peers are done: its own memory is kept, unused, for the life
// of the process, with a warning, rather than freed under a peer's reads.
// A dead peer's memory stays mapped in no survivor.
#pragma once

#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <c10/core/Stream.h>

#include "scheduler/communicator.hpp"

#include <cstdint>
#include <functional>
#include <string>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

namespace dlop::backend {

class ProcessGroupDlop;
class HostSignal;

class SharedDeviceArena : public std::enable_shared_from_this<SharedDeviceArena> {
 public:
  // slabs[r]: rank r's buffer (this rank's own, the others mapped), uint8,
  // each of 2 * slot_bytes, all on `device`.
  // comm: the group's communicator, aborted after a failure here (which
  // leaves barriers queued that no peer may match), and the one whose last
  // barrier lets this rank's memory go.
  SharedDeviceArena(c10::Device device, int rank, std::vector<at::Tensor> slabs, std::size_t slot_bytes,
                    std::weak_ptr<sched::Communicator> comm);

  c10::Device device() const { return device_; }
  std::size_t slot_bytes() const { return slot_bytes_; }
  // Whether an all-reduce of `tensors` with `op` goes through device memory.
  bool serves(const std::vector<at::Tensor>& tensors, const c10d::ReduceOp& op) const;
  // Until release().
  bool serving() const;
  // The all-reduce (serves() must have said yes).
  c10::intrusive_ptr<c10d::Work> allreduce(ProcessGroupDlop& pg, at::Tensor& tensor, const c10d::AllreduceOptions& opts);
  // Serves no more calls, and lets go of the peers' memory once what this
  // rank queued on it has run, and of its own after the group's last barrier,
  // which it waits for (at shutdown: every rank's shutdown waits until every
  // rank's last reduce has passed, or the barrier fails, within the group's
  // timeout). After a failure, `why`, which also aborts the group, so that
  // its queued barriers fail, not run, it returns at once and keeps its own.
  void release(const std::string& why = {});

 private:
  struct Chunk;
  c10::intrusive_ptr<c10d::Work> start_allreduce(ProcessGroupDlop& pg, at::Tensor& tensor,
                                                 const c10d::AllreduceOptions& opts);
  void copy_in(Chunk& chunk);  // with mutex_ held
  void copied_in(std::uint64_t seq);
  void barrier_done(std::uint64_t seq, const at::Tensor& agreed);
  void reduced(std::uint64_t seq);
  // Frees this rank's own memory after the last barrier, or keeps it.
  void let_go_of_own(std::shared_ptr<HostSignal> drained, std::shared_ptr<at::Tensor> own, const std::string& why);

  std::weak_ptr<sched::Communicator> comm_;

  c10::Device device_;
  int rank_;
  std::size_t slot_bytes_;
  c10::Stream to_slot_;    // copies in
  c10::Stream to_caller_;  // reduces (the copy-back stream)

  mutable std::mutex mutex_;
  std::vector<at::Tensor> slabs_;            // mutex_: empty once let go
  bool released_ = false;                      // mutex_
  std::uint64_t next_seq_ = 0;               // mutex_
  std::uint64_t barriers_done_ = 0;          // mutex_: chunks below it have passed their barrier
  std::uint64_t reduced_ = 0;                // mutex_: chunks below it have been reduced
  std::map<std::uint64_t, std::shared_ptr<Chunk>> chunks_;  // mutex_: not yet reduced
};

}  // namespace dlop::backend
