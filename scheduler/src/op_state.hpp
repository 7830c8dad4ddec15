// Private state of submitted operations and of communicators.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "collectives/coll_args.hpp"
#include "collectives/group.hpp"
#include "collectives/task.hpp"

namespace dlop::sched {

class Engine;

// What every operation of one communicator shares.
struct CommState {
  int id = 0;
  std::unique_ptr<coll::Group> group;
  std::uint64_t next_seq = 0;       // collectives submitted so far (submission thread, under the submit lock)
  std::string broken;               // set once an operation failed: later ones fail fast (engine lock)
};

// Tag layout below the transport's 44 user bits:
//   [comm id: 10][p2p: 1][seq: 21][step: 12]  for collectives
//   [comm id: 10][p2p: 1][user tag: 32]       for send/recv
inline constexpr int kCommShift = 34;
inline constexpr int kMaxComms = 1 << 10;
inline constexpr transport::Tag kP2pBit = transport::Tag{1} << 33;
inline constexpr int kSeqShift = coll::kStepBits;
inline constexpr std::uint64_t kSeqMask = (std::uint64_t{1} << 21) - 1;

namespace detail {

struct OpState {
  enum Status : int { kRunning = 0, kDone = 1, kFailed = 2 };

  // Fixed at submission.
  std::weak_ptr<Engine> engine;  // weak: the progress thread must never own its engine
  std::shared_ptr<CommState> comm;
  coll::CollArgs args;
  bool p2p = false;
  bool p2p_send = false;
  int peer = -1;            // p2p: communicator rank, -1 for any
  std::uint32_t tag = 0;    // p2p
  std::uint64_t seq = 0;    // collectives
  bool caller_waits = false;
  std::chrono::milliseconds timeout{0};
  std::chrono::steady_clock::time_point deadline;

  // Engine-side, under the engine lock.
  std::unique_ptr<coll::Task> task;

  // Result.
  std::atomic<int> status{kRunning};
  std::exception_ptr error;
  int source = -1;          // p2p receive: the communicator rank it came from

  // Sleeping waiters and callbacks.
  std::mutex mutex;
  std::condition_variable finished;
  std::vector<std::function<void(std::exception_ptr)>> callbacks;

  bool done() const { return status.load(std::memory_order_acquire) != kRunning; }
  std::string describe() const;
  // Publishes the result, wakes waiters and runs callbacks (no engine lock held).
  void complete(std::exception_ptr failure);
};

}  // namespace detail
}  // namespace dlop::sched
