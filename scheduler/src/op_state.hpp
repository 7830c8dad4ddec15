// Private state of submitted operations and of communicators.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <ctime>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "collectives/coll_args.hpp"
#include "collectives/group.hpp"
#include "collectives/registry.hpp"
#include "collectives/task.hpp"
#include "scheduler/communicator.hpp"

namespace dlop::sched {

class Engine;

// steady_clock's time from the kernel's coarse clock (same origin, a few ms
// of resolution, 10 ns to read instead of 45 ns here): deadlines need no more.
inline std::chrono::steady_clock::time_point coarse_now() {
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  return std::chrono::steady_clock::time_point(std::chrono::seconds(ts.tv_sec) + std::chrono::nanoseconds(ts.tv_nsec));
}

// The algorithms last chosen for this communicator's fixed-size operations,
// keyed on everything selection looks at but the group (fixed per communicator):
// the tuning table is not walked again for the same call.
struct AlgorithmCache {
  struct Entry {
    const coll::Algorithm* algorithm = nullptr;
    coll::CollKind kind{};
    coll::DataType dtype{};
    coll::ReduceOp op{};
    int root = 0;
    std::size_t count = 0;
  };
  static constexpr std::size_t kEntries = 16;
  Entry entries[kEntries];

  // Null for operations with per-rank counts (their vectors are not compared).
  Entry* slot_for(const coll::CollArgs& args) {
    if (!args.counts.empty() || !args.send_counts.empty()) return nullptr;
    const std::size_t h = static_cast<std::size_t>(args.kind) * 31 + args.count * 0x9E3779B1u +
                          static_cast<std::size_t>(args.dtype) * 7 + static_cast<std::size_t>(args.op);
    return &entries[(h ^ (h >> 17)) % kEntries];
  }
  static bool matches(const Entry& e, const coll::CollArgs& args) {
    return e.algorithm != nullptr && e.kind == args.kind && e.count == args.count && e.dtype == args.dtype &&
           e.op == args.op && e.root == args.root;
  }
};

// What every operation of one communicator shares.
struct CommState {
  int id = 0;
  std::unique_ptr<coll::Group> group;
  std::uint64_t next_seq = 0;       // collectives submitted so far (submission thread, under the submit lock)
  std::string broken;               // set once an operation failed: later ones fail fast (engine lock)
  AlgorithmCache algorithms;        // engine lock
  // (operation, size class) whose algorithm choice was logged at info (engine lock).
  std::set<std::pair<coll::CollKind, int>> logged_choices;
  std::uint64_t signature_tasks_made = 0;  // DLOP_DEBUG=detail: tasks made, in sequence order (engine lock)
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
  TrafficClass traffic = TrafficClass::kGradient;
  std::uint64_t deadline_step = 0;  // kData
  std::size_t chunks = 1;           // collectives: chunk i runs as sequence number seq + i
  std::chrono::milliseconds timeout{0};
  std::chrono::steady_clock::time_point deadline;
  std::shared_ptr<const ReadyEvent> ready;  // start only once ready (OpOptions::ready)

  // Engine-side, under the engine lock.
  std::unique_ptr<coll::Task> task;
  bool wake_asked = false;               // gated: `ready` was asked to wake the engine
  bool ready_wakes = false;              // gated: and it will (no need to poll it)
  std::uint64_t order = 0;               // when it started, among this engine's ops
  bool counts_as_gradient = false;       // counted in DataCredits while running
  // Holding between chunks (engine.cpp, Engine::may_begin_chunk).
  std::uint64_t held_for = 0;            // order of the urgent op held for (0: none)
  std::size_t held_mark = 0;             // chunks the held-for op had finished then
  std::chrono::steady_clock::time_point held_since;
  std::uint64_t yielded_up_to = 0;       // no longer held for ops of this order or below
  // DLOP_TRACE only.
  std::chrono::steady_clock::time_point submitted_at;
  std::chrono::steady_clock::time_point started_at;
  std::string_view algorithm;

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

// A collective as submitted: engine, communicator, class and deadline set
// from `options` (timeout: `default_timeout` unless it names one).
std::shared_ptr<OpState> make_op(const std::shared_ptr<Engine>& engine, std::shared_ptr<CommState> comm,
                                 coll::CollArgs args, const OpOptions& options,
                                 std::chrono::milliseconds default_timeout);

}  // namespace detail
}  // namespace dlop::sched
