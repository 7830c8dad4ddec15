#include "scheduler/handle.hpp"

#include <fmt/format.h>

#include "core/config.hpp"
#include "core/wait_policy.hpp"
#include "core/error.hpp"
#include "engine.hpp"
#include "op_state.hpp"

namespace dlop::sched {
namespace detail {

std::string OpState::describe() const {
  if (p2p) {
    return fmt::format("{} of {} x {} {} rank {} (tag {}) on communicator {}", p2p_send ? "send" : "recv", args.count,
                       coll::dtype_name(args.dtype), p2p_send ? "to" : "from", peer < 0 ? std::string("any") : std::to_string(peer),
                       tag, comm->id);
  }
  const bool reduces = args.kind == coll::CollKind::kAllreduce || args.kind == coll::CollKind::kReduce ||
                       args.kind == coll::CollKind::kReduceScatter || args.kind == coll::CollKind::kReduceScatterv;
  return fmt::format("{} #{} ({} x {}{}) on communicator {}", coll::kind_name(args.kind), seq, args.count,
                     coll::dtype_name(args.dtype), reduces ? fmt::format(", {}", coll::op_name(args.op)) : "", comm->id);
}

void OpState::complete(std::exception_ptr failure) {
  std::vector<std::function<void(std::exception_ptr)>> to_run;
  {
    std::lock_guard lock(mutex);
    error = failure;
    status.store(failure ? kFailed : kDone, std::memory_order_release);
    to_run.swap(callbacks);
  }
  finished.notify_all();
  for (auto& callback : to_run) callback(failure);
}

std::shared_ptr<OpState> make_op(const std::shared_ptr<Engine>& engine, std::shared_ptr<CommState> comm,
                                 coll::CollArgs args, const OpOptions& options,
                                 std::chrono::milliseconds default_timeout) {
  auto op = std::make_shared<OpState>();
  op->engine = engine;
  op->comm = std::move(comm);
  op->args = std::move(args);
  op->caller_waits = options.caller_waits;
  op->traffic = options.traffic;
  op->deadline_step = options.deadline_step;
  op->timeout = options.timeout.value_or(default_timeout);
  op->deadline = coarse_now() + op->timeout;
  op->ready = options.ready;
  return op;
}

}  // namespace detail

bool Handle::test() const {
  if (!state_) return true;
  if (!state_->done()) {
    if (auto engine = state_->engine.lock()) engine->try_progress();
  }
  return state_->done();
}

void Handle::wait() const {
  // The engine fails the operation at its deadline with the better message
  // (naming the silent ranks); the margin only guards against a stuck engine.
  if (state_) wait(state_->timeout + std::chrono::seconds(5));
}

void Handle::wait(std::chrono::milliseconds timeout) const {
  if (!state_) return;
  using Clock = std::chrono::steady_clock;
  // Most blocking calls on small data finish within a few passes: no clock
  // read, no configuration look-up for them.
  if (!state_->done()) {
    if (const auto engine = state_->engine.lock()) {
      for (int i = 0; i < 16 && !state_->done(); ++i) engine->try_progress();
    }
  }
  if (state_->done()) {
    if (state_->status.load(std::memory_order_acquire) == detail::OpState::kFailed) std::rethrow_exception(state_->error);
    return;
  }
  const auto deadline = Clock::now() + timeout;
  const auto engine = state_->engine.lock();  // null once shut down: every op is complete then
  // Drive progress ourselves while the wait policy polls; then let the
  // progress thread work and sleep until it finishes the operation.
  Engine::Driver driving(engine.get());
  Waiter waiter;
  for (unsigned round = 1; engine && !state_->done(); ++round) {
    engine->try_progress();
    if (state_->done()) break;
    if (waiter.pause()) {
      if ((round & 15u) != 0 || Clock::now() < deadline) continue;
      break;
    }
    driving.stop();
    engine->wake_progress_thread();
    std::unique_lock lock(state_->mutex);
    const auto now = Clock::now();
    if (now >= deadline) break;
    state_->finished.wait_until(lock, std::min(deadline, now + std::chrono::milliseconds(10)),
                                [&] { return state_->done(); });
  }
  if (!state_->done()) {
    throw_error(Errc::kTimeout, fmt::format("waited {} ms for {}; it is still running", timeout.count(), state_->describe()));
  }
  if (state_->status.load(std::memory_order_acquire) == detail::OpState::kFailed) std::rethrow_exception(state_->error);
}

std::exception_ptr Handle::error() const {
  if (!state_ || !state_->done()) return nullptr;
  return state_->error;
}

void Handle::on_complete(std::function<void(std::exception_ptr)> callback) const {
  if (!state_) {
    callback(nullptr);
    return;
  }
  {
    std::lock_guard lock(state_->mutex);
    if (!state_->done()) {
      state_->callbacks.push_back(std::move(callback));
      return;
    }
  }
  callback(state_->error);
}

int Handle::source() const { return state_ && state_->done() ? state_->source : -1; }

std::string Handle::describe() const { return state_ ? state_->describe() : "nothing"; }

}  // namespace dlop::sched
