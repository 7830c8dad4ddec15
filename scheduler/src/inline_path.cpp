// The fast path of a small blocking all-reduce (engine.hpp, Engine::run_inline).
//
// A blocking 8 B all-reduce through the queue costs an OpState, a Task, two
// lock round trips and a completion; together several times the exchange of
// one cache line with the peers. When the engine runs nothing, no ordering or
// priority is at stake: the caller takes the next sequence numbers itself and
// drives the host arena's inline round under the engine lock (the arena's
// bookkeeping and the mesh's liveness checks need it). The lock is held for a
// bounded number of polls; peers still late then, the round becomes an
// ordinary running op, with the op's deadline, dead-peer checks and progress
// by whoever holds the lock. It is not counted as gradient traffic in the
// data credits while on the fast path: it lasts microseconds.
//
// Every rank makes the same arena rounds in the same order whichever path
// each one takes: the fast path runs only when nothing is queued or running
// here, so its round is the next one the queue would have made, and a round is
// made only when selection picks the inline algorithm, as the queue would.
#include "collectives/inline_allreduce.hpp"
#include "core/error.hpp"
#include "core/trace.hpp"
#include "core/wait_policy.hpp"
#include "engine.hpp"

namespace dlop::sched {
namespace {

// Polls under the engine lock before the round is handed over: 16 us of a
// peer's lateness here (a poll loads a line that has not changed, and
// pauses); ranks calling in a tight loop are closer than that. Without a
// core each (the wait policy does not spin), polling would only keep the
// peer it waits for off the core: the queue's waits yield instead.
constexpr int kSpinPolls = 512;
constexpr int kPollsWithoutSpin = 1;

}  // namespace

std::optional<Handle> Engine::run_inline(const std::shared_ptr<CommState>& comm, const coll::CollArgs& args,
                                         const OpOptions& options, std::chrono::milliseconds default_timeout) {
  // Signature checks and traces see every op in the queue.
  if (!options.caller_waits || options.ready || args.count == 0 || check_signatures_ || trace::enabled() ||
      !coll::InlineAllreduceRound::accepts(args, *comm->group)) {
    return std::nullopt;
  }
  std::unique_lock lock(engine_mutex_, std::try_to_lock);
  if (!lock.owns_lock() || !running_.empty() || !gated_.empty() || !comm->broken.empty()) return std::nullopt;
  try {
    if (select(*comm, args).name != coll::kInlineAllreduceName) return std::nullopt;
  } catch (const Error&) {
    return std::nullopt;  // a DLOP_ALGO choice that declines: the queue fails the op with it, as for any op
  }
  std::uint64_t seq = 0;
  {
    std::lock_guard submit_lock(submit_mutex_);
    if (!submitted_.empty()) return std::nullopt;  // they come first
    seq = comm->next_seq++;
  }
  coll::InlineAllreduceRound round(args, *comm->group);
  std::exception_ptr error;
  try {
    const int polls = WaitPolicy::process().mode() == WaitMode::kSpin ? kSpinPolls : kPollsWithoutSpin;
    for (int i = 0; i < polls; ++i) {
      if (round.progress()) return Handle();
      cpu_relax();
    }
  } catch (...) {
    error = std::current_exception();
  }
  // Late peers or a failure: the op joins the running ones as if submitted.
  auto op = detail::make_op(shared_from_this(), comm, args, options, default_timeout);
  op->seq = seq;
  op->order = ++started_ops_;
  op->algorithm = coll::kInlineAllreduceName;
  if (error) {
    fail(*op, error);  // finished by the next pass, like a task that threw
  } else {
    op->task = coll::as_task(std::move(round));
    count_if_gradient(*op);
  }
  Handle handle(op);
  add_running(std::move(op));
  return handle;
}

}  // namespace dlop::sched
