// How a thread waits for what another thread or process will do.
//
//   spin   poll without pause: the lowest latency, when every waiting rank has
//          a core of its own (a spin only wastes a core nobody else wanted)
//   yield  poll, and give the core away between polls (sched_yield): when
//          ranks outnumber cores, the rank a waiter waits for is often the one
//          its spinning keeps off the core
//   sleep  block on an event, or sleep between polls
//
// Each mode bounds its polling phase and then blocks, so that a long wait
// (a straggler, an idle peer) costs no CPU. The process's mode is chosen when
// its engine starts, from the ranks sharing this machine's cores and the
// cores they may use (core/machine_cores.hpp), and changed at run time when
// spinning waits keep losing their core (the machine is busier than the count
// said: torch's intra-op threads, other jobs). DLOP_PROGRESS=spin|yield|sleep overrides both.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/config.hpp"
#include "core/machine_cores.hpp"

namespace dlop {

enum class WaitMode : std::uint8_t { kSpin, kYield, kSleep };

// Tells the core a spin-wait is in progress (saves power, frees the sibling hyperthread).
inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield" ::: "memory");
#else
  std::atomic_signal_fence(std::memory_order_seq_cst);
#endif
}

std::string_view wait_mode_name(WaitMode mode);

// The mode for `local_ranks` processes of one job sharing `cores` cores.
struct WaitChoice {
  WaitMode mode = WaitMode::kSpin;
  std::string why;
};
WaitChoice choose_wait_mode(ProgressMode requested, double cores, int local_ranks);

// The process-wide mode. Reads are one relaxed atomic load.
class WaitPolicy {
 public:
  static WaitPolicy& process();

  WaitMode mode() const { return mode_.load(std::memory_order_relaxed); }
  // From an engine that starts with `local_ranks` ranks (itself included)
  // that may use `cores` together (shared_cores); logs the choice at info when it
  // changes the mode.
  void decide(int local_ranks, const CoreBudget& cores);
  // A wait that spun for `wall` and was on a core for `on_cpu` of it. Spins
  // that keep getting less than half their time on a core switch an automatic
  // spin policy to yield (logged at info).
  void report_spin(std::chrono::nanoseconds wall, std::chrono::nanoseconds on_cpu);
  // Spins shorter than this are not judged (a timeslice tick is noise there).
  static constexpr std::chrono::microseconds kJudgedSpin{50};
  // Of the last kWindow judged spins, this many losing their core switch the mode.
  static constexpr int kWindow = 8;
  static constexpr int kLostToSwitch = 6;

  // Starts over as if `requested` were DLOP_PROGRESS: no decision, no history.
  void reset(ProgressMode requested);

 private:
  WaitPolicy();
  void set(WaitMode mode, const std::string& why);

  std::atomic<WaitMode> mode_{WaitMode::kSpin};
  std::atomic<bool> automatic_{true};  // false when DLOP_PROGRESS named a mode
  std::atomic<std::uint32_t> history_{0};  // bit k: the k-th last judged spin lost its core
  std::atomic<int> judged_{0};
};

// One wait's pauses between polls: call pause() after each poll that found
// nothing. It returns false when the polling phase is over (after `spin` of
// spinning or `yield` of yielding) and the caller should block on its own
// event (or sleep, see sleep_a_little). `requested` kAuto follows the
// process's WaitPolicy; kSpin spins for the whole wait. A spin is reported to
// the policy when its phase ends.
//
// The phase is timed from the first clock read, a few polls in: most waits of
// small operations end before it, and a Waiter that reads no clock costs no
// system call (the thread's CPU time, which judges a spin, is one).
class Waiter {
 public:
  explicit Waiter(ProgressMode requested = config().progress, std::chrono::microseconds spin = config().spin,
                  std::chrono::microseconds yield = std::chrono::milliseconds(20));
  ~Waiter();
  Waiter(const Waiter&) = delete;
  Waiter& operator=(const Waiter&) = delete;

  bool pause();
  WaitMode mode() const { return mode_; }
  // For waits with no event to block on: sleeps a pause that grows from 10 us
  // to 1 ms over the calls.
  void sleep_a_little();

 private:
  // The first clock read: the phase starts, measured from now.
  void start(std::chrono::steady_clock::time_point now);

  WaitMode mode_;
  bool spin_whole_wait_ = false;  // requested kSpin
  std::chrono::microseconds budget_;  // of the polling phase
  std::chrono::steady_clock::time_point start_;  // epoch until started
  std::chrono::steady_clock::time_point poll_until_;
  std::chrono::nanoseconds cpu_start_{0};
  std::chrono::microseconds sleep_{10};
  unsigned rounds_ = 0;
  bool polling_ = true;
};

}  // namespace dlop
