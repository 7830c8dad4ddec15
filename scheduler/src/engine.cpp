#include "engine.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <bit>

#include "chunked_task.hpp"
#include "collectives/select_reason.hpp"
#include "core/config.hpp"
#include "core/error.hpp"
#include "core/log.hpp"
#include "core/machine_cores.hpp"
#include "core/trace.hpp"
#include "core/wait_policy.hpp"
#include "signature_check.hpp"
#include "transport/shm_segment.hpp"

namespace dlop::sched {
namespace {

using Clock = std::chrono::steady_clock;

// The longest a chunked op waits between chunks for one more urgent
// collective that makes no visible progress (a chunked one shows each chunk
// it finishes): chunked_task.hpp says why bounded holding rules out deadlock.
constexpr auto kMaxHold = std::chrono::milliseconds(50);

// A send or receive of Communicator::send/recv, as a task.
class P2pTask : public coll::Task {
 public:
  explicit P2pTask(transport::Request request) : request_(std::move(request)) {}
  bool progress() override { return request_.test(); }
  const transport::Request& request() const { return request_; }

 private:
  transport::Request request_;
};

transport::Tag collective_tag(int comm_id, std::uint64_t seq) {
  return (static_cast<transport::Tag>(comm_id) << kCommShift) | ((seq & kSeqMask) << kSeqShift);
}

transport::Tag op_tag(const detail::OpState& op) {
  if (op.p2p) return (static_cast<transport::Tag>(op.comm->id) << kCommShift) | kP2pBit | op.tag;
  return collective_tag(op.comm->id, op.seq);
}

// Urgency for the progress order: class, then a data op's deadline step.
std::pair<int, std::uint64_t> urgency(const detail::OpState& op) {
  return {static_cast<int>(op.traffic), op.traffic == TrafficClass::kData ? op.deadline_step : 0};
}

std::int64_t as_int(std::size_t n) { return static_cast<std::int64_t>(n); }

void trace_op(const detail::OpState& op) {
  const std::size_t bytes = op.p2p ? op.args.count * op.args.element_size() : op.args.bytes();
  std::string name = op.p2p ? (op.p2p_send ? "send" : "recv") : std::string(coll::kind_name(op.args.kind));
  trace::span(std::move(name), std::string(traffic_class_name(op.traffic)), op.started_at, Clock::now(),
              {{"seq", as_int(op.seq)},
               // From submission to start: a device copy or earlier ops held it.
               {"queued_us", std::chrono::duration_cast<std::chrono::microseconds>(op.started_at - op.submitted_at).count()},
               {"comm", op.comm->id},
               {"bytes", as_int(bytes)},
               {"count", as_int(op.args.count)},
               {"dtype", std::string(coll::dtype_name(op.args.dtype))},
               {"class", std::string(traffic_class_name(op.traffic))},
               {"algorithm", std::string(op.p2p ? "p2p" : op.algorithm)},
               {"chunks", as_int(op.chunks)},
               {"status", std::string(op.error ? "failed" : "done")}});
}

// The ranks sharing this machine's cores, and the cores they may use
// (collective over the bootstrap).
SharedCores machine_shared_cores(transport::Bootstrap& bootstrap) {
  const std::string mine = RankCores::self().encode();
  const std::vector<transport::Bytes> all =
      bootstrap.allgather(transport::Bytes(mine.begin(), mine.end()), config().timeout);
  std::vector<RankCores> ranks;
  ranks.reserve(all.size());
  for (std::size_t r = 0; r < all.size(); ++r) {
    const std::string text(all[r].begin(), all[r].end());
    ranks.push_back(RankCores::decode(text, fmt::format("engine: rank {}", r)));
  }
  return shared_cores(ranks, static_cast<std::size_t>(bootstrap.rank()));
}

}  // namespace

Engine::Engine(transport::Bootstrap& bootstrap, bool check_signatures, Scheduling scheduling)
    : bootstrap_(&bootstrap),
      worker_(std::make_unique<transport::UcxWorker>()),
      mesh_(std::make_unique<transport::Mesh>(*worker_, bootstrap)),
      overrides_(coll::AlgorithmOverrides::parse(config().algo)),
      check_signatures_(check_signatures),
      scheduling_(scheduling) {
  // Whatever killed processes of earlier jobs left in /dev/shm (segments
  // whose creator is dead) goes now, not only when this host next makes one.
  transport::ShmSegment::remove_stale_segments();
  wake_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (wake_fd_ < 0) throw_errno("eventfd");
  const int handle = ::fcntl(wake_fd_, F_DUPFD_CLOEXEC, 0);
  if (handle < 0) throw_errno("dup of the engine's eventfd");
  wake_handle_ = std::shared_ptr<const int>(new int(handle), [](const int* fd) {
    ::close(*fd);
    delete fd;
  });
  const SharedCores shared = machine_shared_cores(bootstrap);
  WaitPolicy::process().decide(shared.ranks, shared.budget);
  thread_ = std::thread([this] { thread_main(); });
}

Engine::~Engine() {
  stop_.store(true);
  wake_progress_thread();
  thread_.join();
  std::vector<std::shared_ptr<detail::OpState>> left;
  {
    std::lock_guard lock(submit_mutex_);
    left.assign(submitted_.begin(), submitted_.end());
    submitted_.clear();
  }
  left.insert(left.end(), gated_.begin(), gated_.end());
  gated_.clear();
  left.insert(left.end(), running_.begin(), running_.end());
  running_.clear();
  for (auto& op : left) {
    op->task.reset();
    op->complete(std::make_exception_ptr(Error(Errc::kCanceled, "dlop: the engine shut down before " + op->describe() + " finished")));
  }
  if (!world_aborted_.load()) {
    try {
      mesh_->fence(std::chrono::milliseconds(2000));  // let peers finish what needs our progress
    } catch (const std::exception& e) {
      log().info("engine shutdown: fence incomplete: {}", e.what());
    }
  }
  ::close(wake_fd_);
  trace::flush();
}

void Engine::reserve_comm_id(int id) {
  if (id >= kMaxComms) throw_error(Errc::kInvalidArgument, fmt::format("more than {} communicators", kMaxComms));
  int current = next_comm_id_.load();
  while (current <= id && !next_comm_id_.compare_exchange_weak(current, id + 1)) {
  }
}

void Engine::submit(std::shared_ptr<detail::OpState> op) {
  const bool wake = !op->caller_waits;
  // Gradient ops are never held (no class is more urgent), so cutting them
  // would only add a synchronisation per chunk (16% at 16 MiB here): only
  // ops that yield are chunked.
  if (!op->p2p && scheduling_.traffic_classes && op->traffic != TrafficClass::kGradient &&
      op->args.kind == coll::CollKind::kAllreduce) {
    op->chunks = chunk_count(op->args.bytes(), scheduling_.chunk_bytes);
  }
  {
    std::lock_guard lock(submit_mutex_);
    if (!op->p2p) {  // in queue order; one sequence number per chunk
      op->seq = op->comm->next_seq;
      op->comm->next_seq += op->chunks;
    }
    if (trace::enabled()) op->submitted_at = Clock::now();
    submitted_.push_back(std::move(op));
    has_submitted_.store(true, std::memory_order_release);
  }
  if (wake) wake_progress_thread();
}

void Engine::wake_progress_thread() {
  const std::uint64_t one = 1;
  [[maybe_unused]] const auto written = ::write(wake_fd_, &one, sizeof(one));
}

void Engine::try_progress() {
  // A waiting caller calls this in a loop, mostly to find nothing finished:
  // that pass touches neither the heap nor thread-local storage (a call into
  // the TLS resolver from a shared library). A pass that finished ops hands
  // them to this thread's list, which keeps its capacity between calls (and
  // gives it to finished_), so none allocates either. A completion callback
  // that progresses again finds the spare taken and uses a list of its own.
  std::unique_lock lock(engine_mutex_, std::try_to_lock);
  if (!lock.owns_lock()) return;
  progress_locked(finished_);
  if (finished_.empty()) return;
  thread_local std::vector<std::shared_ptr<detail::OpState>> spare;
  std::vector<std::shared_ptr<detail::OpState>> finished = std::move(spare);
  finished.swap(finished_);
  lock.unlock();
  finish_all(finished);  // leaves it empty
  spare = std::move(finished);
}

void Engine::finish_all(std::vector<std::shared_ptr<detail::OpState>>& finished) {
  for (auto& op : finished) {
    if (op->counts_as_gradient) {
      op->counts_as_gradient = false;
      data_credits_->gradient_finished();
    }
    if (trace::enabled()) trace_op(*op);
    op->complete(op->error);
  }
  finished.clear();
}

void Engine::fail(detail::OpState& op, std::exception_ptr error) {
  op.error = error;
  op.task.reset();
  if (!op.p2p && op.comm->broken.empty()) {
    try {
      std::rethrow_exception(error);
    } catch (const std::exception& e) {
      op.comm->broken = e.what();
    }
  }
}

void Engine::start(const std::shared_ptr<detail::OpState>& op) {
  op->order = ++started_ops_;
  if (trace::enabled()) op->started_at = Clock::now();
  try {
    if (!op->comm->broken.empty()) {
      throw_error(Errc::kCanceled, fmt::format("{} refused: the communicator failed earlier: {}", op->describe(),
                                               op->comm->broken));
    }
    const coll::Group& group = *op->comm->group;
    const transport::Tag tag = op_tag(*op);
    if (op->p2p) {
      const std::size_t bytes = op->args.count * op->args.element_size();
      if (op->p2p_send) {
        op->task = std::make_unique<P2pTask>(group.send(op->peer, op->args.send, bytes, tag));
      } else if (op->peer >= 0) {
        op->task = std::make_unique<P2pTask>(group.recv(op->peer, op->args.recv, bytes, tag));
      } else {
        op->task = std::make_unique<P2pTask>(mesh_->recv_any(op->args.recv, bytes, tag));
      }
      return;
    }
    // Tasks are made in submission order on every rank: first the chunks
    // not made yet of this communicator's running chunked ops.
    for (const auto& other : running_) {
      if (other->comm == op->comm && other->chunks > 1 && other->task) static_cast<ChunkedTask&>(*other->task).make_all();
    }
    const coll::Algorithm& algorithm = select(*op->comm, op->args);
    if (log().should_log(spdlog::level::debug)) log().debug("{}: algorithm {}", op->describe(), algorithm.name);
    op->algorithm = algorithm.name;
    op->task = make_task(op, algorithm);
    count_if_gradient(*op);
  } catch (...) {
    fail(*op, std::current_exception());
  }
}

void Engine::count_if_gradient(detail::OpState& op) {
  if (op.traffic != TrafficClass::kGradient) return;
  op.counts_as_gradient = true;  // finish_all reports its end
  data_credits_->gradient_started();
}

std::unique_ptr<coll::Task> Engine::make_task(const std::shared_ptr<detail::OpState>& op,
                                              const coll::Algorithm& algorithm) {
  const coll::Group& group = *op->comm->group;
  if (op->chunks == 1) {
    const transport::Tag tag = op_tag(*op);
    return check_signatures_ ? make_signature_checked(op->args, *op->comm, tag, op->seq, algorithm)
                             : algorithm.create(op->args, group, tag);
  }
  // Each chunk runs the algorithm chosen for the whole op (what it would run
  // unchunked) if that accepts the chunk: the same choice on every rank.
  detail::OpState* whole = op.get();  // owns the task: outlives it
  auto make = [this, whole, &algorithm, &group](std::size_t index) {
    const ChunkRange range = chunk_range(whole->args.count, whole->chunks, index);
    const std::size_t offset = range.first * whole->args.element_size();
    coll::CollArgs chunk = whole->args;
    chunk.send = static_cast<const std::byte*>(whole->args.send) + offset;
    chunk.recv = static_cast<std::byte*>(whole->args.recv) + offset;
    chunk.count = range.count;
    const coll::Algorithm& chosen =
        algorithm.accepts(chunk, group) ? algorithm : coll::select_algorithm(chunk, group, overrides_);
    const std::uint64_t seq = whole->seq + index;
    const transport::Tag tag = collective_tag(whole->comm->id, seq);
    return check_signatures_ ? make_signature_checked(chunk, *whole->comm, tag, seq, chosen)
                             : chosen.create(chunk, group, tag);
  };
  ChunkedTask::ChunkDone done;
  if (trace::enabled()) {
    done = [whole](std::size_t index, Clock::time_point start, Clock::time_point end) {
      const ChunkRange range = chunk_range(whole->args.count, whole->chunks, index);
      trace::span(fmt::format("{} chunk", coll::kind_name(whole->args.kind)),
                  std::string(traffic_class_name(whole->traffic)), start, end,
                  {{"seq", as_int(whole->seq + index)},
                   {"op_seq", as_int(whole->seq)},
                   {"comm", whole->comm->id},
                   {"chunk", as_int(index)},
                   {"chunks", as_int(whole->chunks)},
                   {"bytes", as_int(range.count * whole->args.element_size())},
                   {"class", std::string(traffic_class_name(whole->traffic))},
                   {"algorithm", std::string(whole->algorithm)}});
    };
  }
  return std::make_unique<ChunkedTask>(op->chunks, std::move(make), std::move(done));
}

void Engine::add_running(std::shared_ptr<detail::OpState> op) {
  if (!scheduling_.traffic_classes) {
    running_.push_back(std::move(op));
    return;
  }
  // After every op at least as urgent: equals stay in start order.
  const auto place = std::upper_bound(running_.begin(), running_.end(), op,
                                      [](const auto& a, const auto& b) { return urgency(*a) < urgency(*b); });
  running_.insert(place, std::move(op));
}

bool Engine::may_begin_chunk(detail::OpState& op, const std::vector<detail::OpState*>& in_flight,
                             Clock::time_point now) {
  for (detail::OpState* other : in_flight) {
    if (urgency(*other) >= urgency(op) || other->order <= op.yielded_up_to) continue;
    const std::size_t mark = other->chunks > 1 ? static_cast<const ChunkedTask&>(*other->task).chunks_done() : 0;
    if (op.held_for != other->order || op.held_mark != mark) {
      op.held_for = other->order;
      op.held_mark = mark;
      op.held_since = now;
    }
    if (now - op.held_since < kMaxHold) return false;
    // A peer may not submit `other` until this op finished there: stop
    // yielding to it (and to anything that started before it).
    op.yielded_up_to = other->order;
    log().debug("{}: stops yielding to {} after {} ms", op.describe(), other->describe(), kMaxHold.count());
  }
  op.held_for = 0;
  return true;
}

int Engine::dead_member(const detail::OpState& op) const {
  const auto& group = *op.comm->group;
  for (int r = 0; r < group.size(); ++r) {
    if (mesh_->peer_failure(group.mesh_rank(r))) return r;
  }
  return -1;
}

std::vector<int> Engine::awaited(const detail::OpState& op) const {
  std::vector<int> ranks = mesh_->pending_peers();
  for (const int r : op.task->waiting_for()) ranks.push_back(op.comm->group->mesh_rank(r));
  std::sort(ranks.begin(), ranks.end());
  ranks.erase(std::unique(ranks.begin(), ranks.end()), ranks.end());
  return ranks;
}

const coll::Algorithm& Engine::select(CommState& comm, const coll::CollArgs& args) {
  AlgorithmCache::Entry* cached = comm.algorithms.slot_for(args);
  if (cached != nullptr && AlgorithmCache::matches(*cached, args)) return *cached->algorithm;
  // At info, the first choice for each (operation, size class) of a group is
  // logged with its reason, so a run shows which algorithms served it.
  std::string why;
  const bool tell = log().should_log(spdlog::level::info);
  const coll::Algorithm& algorithm = tell ? coll::select_algorithm(args, *comm.group, overrides_, why)
                                          : coll::select_algorithm(args, *comm.group, overrides_);
  const std::size_t bytes = args.bytes();
  const int size_class = std::bit_width(bytes);  // bytes in [2^(c-1), 2^c)
  if (tell && comm.logged_choices.emplace(args.kind, size_class).second) {
    log().info("comm {} ({} ranks): {} of {} to {} B: algorithm {} ({})", comm.id, comm.group->size(),
               coll::kind_name(args.kind), size_class == 0 ? 0 : std::size_t{1} << (size_class - 1),
               size_class == 0 ? 0 : (std::size_t{1} << size_class) - 1, algorithm.name, why);
  }
  if (cached != nullptr) {
    *cached = {.algorithm = &algorithm, .kind = args.kind, .dtype = args.dtype, .op = args.op,
               .root = args.root, .count = args.count};
  }
  return algorithm;
}

bool Engine::progress_locked(std::vector<std::shared_ptr<detail::OpState>>& finished) {
  if (has_submitted_.load(std::memory_order_acquire)) {
    {
      std::lock_guard lock(submit_mutex_);
      starting_.swap(submitted_);  // both keep their capacity: no allocation per op
      has_submitted_.store(false, std::memory_order_relaxed);
    }
    for (auto& op : starting_) {
      if (gated_.empty() && (!op->ready || op->ready->ready())) {
        start(op);
        add_running(std::move(op));
      } else {
        gated_.push_back(std::move(op));
      }
    }
    starting_.clear();
  }
  if (!gated_.empty()) start_ready_gated(finished);
  if (!gated_.empty()) ask_front_to_wake();
  if (running_.empty()) {
    // A send UCX completed may still sit in its TCP buffer (an eager send to
    // another host larger than the socket had room for): only progress writes
    // it out, after the op that sent it is gone.
    mesh_->progress();
    return !gated_.empty();
  }
  // Tasks that only poll shared memory need no UCX pass (a third of a small
  // all-reduce's polling loop): their peers' deaths are found by their own
  // liveness checks (StallWatch). One pass in kMemoryOnlyPasses still
  // progresses UCX, for what else travels through it meanwhile (a peer's
  // messages ahead of their receives, endpoint errors).
  const bool memory_only = std::all_of(running_.begin(), running_.end(),
                                       [](const auto& op) { return !op->task || op->task->polls_memory(); });
  if (!memory_only || ++memory_only_passes_ % kMemoryOnlyPasses == 0) mesh_->progress();
  const auto now = coarse_now();
  in_flight_.clear();
  for (auto& op : running_) {
    if (!op->task) {
      finished.push_back(op);
      continue;
    }
    try {
      // Not held: with signature checks (a later op's task is made only
      // after this one's chunks are) or on the host arena (later arena ops
      // run behind its chunks anyway): holding would only stall both.
      if (op->chunks > 1 && !check_signatures_) {
        auto& chunked = static_cast<ChunkedTask&>(*op->task);
        chunked.allow_next(!chunked.between_chunks() || chunked.chunks_poll_memory() ||
                           may_begin_chunk(*op, in_flight_, now));
      }
      if (op->task->progress()) {
        if (op->p2p && !op->p2p_send) {
          const int mesh_rank = static_cast<const P2pTask&>(*op->task).request().source();
          for (int r = 0; r < op->comm->group->size(); ++r) {
            if (op->comm->group->mesh_rank(r) == mesh_rank) op->source = r;
          }
        }
        op->task.reset();
        finished.push_back(op);
      } else if (const int dead = mesh_->dead_peers() > 0 && !op->p2p ? dead_member(*op) : -1; dead >= 0) {
        // A collective cannot finish without every member, and this rank may
        // be waiting only on live ones that wait on the dead one: fail it now,
        // naming the dead rank, rather than at the timeout naming a live one.
        const int mesh_rank = op->comm->group->mesh_rank(dead);
        throw_error(Errc::kPeerDead, fmt::format("{} failed: {} died ({})", op->describe(), mesh_->describe(mesh_rank),
                                                 *mesh_->peer_failure(mesh_rank)));
      } else if (now >= op->deadline) {
        throw_error(Errc::kTimeout, fmt::format("{} timed out after {} ms; ranks still awaited: {}", op->describe(),
                                                op->timeout.count(), awaited(*op)));
      }
    } catch (...) {
      fail(*op, std::current_exception());
      finished.push_back(op);
    }
    if (op->task && !op->p2p) in_flight_.push_back(op.get());
  }
  if (!finished.empty()) {
    std::erase_if(running_, [](const auto& op) { return !op->task; });
  }
  return !running_.empty();
}

void Engine::ask_front_to_wake() {
  auto& op = *gated_.front();
  if (op.wake_asked || !op.ready) return;
  op.wake_asked = true;
  op.ready_wakes = op.ready->notify_when_ready([handle = wake_handle_] {
    const std::uint64_t one = 1;
    [[maybe_unused]] const auto written = ::write(*handle, &one, sizeof(one));
  });
}

void Engine::start_ready_gated(std::vector<std::shared_ptr<detail::OpState>>& finished) {
  while (!gated_.empty()) {
    auto& op = gated_.front();
    if (!op->ready || op->ready->ready()) {
      start(op);
      add_running(std::move(op));
    } else if (coarse_now() >= op->deadline) {
      // The ops behind it start: ranks whose device copy finished started it,
      // and fail it in turn by their own timeout or this rank's absence.
      fail(*op, std::make_exception_ptr(Error(
                    Errc::kTimeout, fmt::format("{} timed out after {} ms before it could start: still waiting for {}",
                                                op->describe(), op->timeout.count(), op->ready->describe()))));
      finished.push_back(std::move(op));
    } else {
      return;
    }
    gated_.pop_front();
  }
}

void Engine::sleep_until_woken(int timeout_ms, bool with_ucx) {
  pollfd fds[2] = {{wake_fd_, POLLIN, 0}, {mesh_->event_fd(), POLLIN, 0}};
  const bool ucx = with_ucx && fds[1].fd >= 0;
  ::poll(fds, ucx ? 2 : 1, timeout_ms);
  std::uint64_t drained = 0;
  [[maybe_unused]] const auto got = ::read(wake_fd_, &drained, sizeof(drained));
}

void Engine::nap_until_woken(std::chrono::microseconds nap) {
  pollfd fd{wake_fd_, POLLIN, 0};
  const timespec timeout{0, static_cast<long>(std::chrono::nanoseconds(nap).count())};
  ::ppoll(&fd, 1, &timeout, nullptr);
  std::uint64_t drained = 0;
  [[maybe_unused]] const auto got = ::read(wake_fd_, &drained, sizeof(drained));
}

void Engine::thread_main() {
  ::pthread_setname_np(::pthread_self(), "dlop-progress");
  constexpr int kSpinPasses = 200;  // passes without news before sleeping
  // Once the thread slept with ops running, their next news is an event
  // away (a packet, a late peer's message), and 200 passes after each
  // wake-up cost a core (4x Gloo's CPU for DDP across hosts, taken from its
  // compute; 8 passes still 2x). So sleep again at the first quiet pass,
  // until an op finishes or starts.
  constexpr int kStreamPasses = 1;
  // Ops that poll memory signal no event: after kSpinPasses, about a
  // millisecond of yielding passes, then naps.
  constexpr int kYieldPasses = 1000;
  constexpr std::chrono::microseconds kFirstNap{20};
  constexpr std::chrono::microseconds kLongestNap{250};
  std::chrono::microseconds nap = kFirstNap;
  std::vector<std::shared_ptr<detail::OpState>> finished;
  int idle_passes = 0;
  int spin_passes = kSpinPasses;
  while (!stop_.load()) {
    const WaitMode mode = WaitPolicy::process().mode();
    if (mode != WaitMode::kSpin && drivers_.load(std::memory_order_relaxed) > 0) {
      sleep_until_woken(1, false);  // a waiting caller drives progress
      continue;
    }
    std::unique_lock lock(engine_mutex_, std::try_to_lock);
    if (!lock.owns_lock()) {  // a waiting caller drives progress now
      lock = {};
      sleep_until_woken(1, false);
      continue;
    }
    // Ops gated on a device copy count as running: waiting for the copy, the
    // thread naps like any other wait rather than spinning on the device.
    const bool had = !running_.empty() || !gated_.empty();
    const std::uint64_t started_before = started_ops_;
    const bool running = progress_locked(finished);
    const bool moved = started_ops_ != started_before;  // a gated op started: news like a finished one
    // A task with a reduction chunk still to do is busy, not waiting: a pass
    // that ran one is news (one sleep per chunk cost a millisecond each).
    const bool local_work = running && std::any_of(running_.begin(), running_.end(), [](const auto& op) {
      return op->task && op->task->has_local_work();
    });
    idle_passes = (running && had && finished.empty() && !local_work && !moved) ? idle_passes + 1 : 0;
    if (!had || !finished.empty() || moved) spin_passes = kSpinPasses;
    // Idle, the thread sleeps on UCX's events too: data UCX still holds for a
    // peer (above) leaves as the socket drains, and a peer's early messages
    // are taken in. Events pending (arm fails): look again first.
    bool sleep = running ? idle_passes > spin_passes && mesh_->arm() : mesh_->arm() || mesh_->event_fd() < 0;
    // A device copy whose event cannot wake the thread is polled, like
    // shared memory. An op started from a device copy is polled too: its
    // peers' copies finish at their own pace, and a sleep on UCX's events
    // (1 ms at most) would hold back a step that waits on it.
    const bool polls_memory =
        sleep && running &&
        ((!gated_.empty() && !gated_.front()->ready_wakes) ||
         std::any_of(running_.begin(), running_.end(),
                     [](const auto& op) { return op->task && (op->ready || op->task->polls_memory()); }));
    // Only gated ops whose events wake the thread: nothing to look at until then.
    const bool only_woken_gated = running_.empty() && !gated_.empty() && gated_.front()->ready_wakes;
    lock.unlock();
    finish_all(finished);
    if (idle_passes == 0) nap = kFirstNap;
    if (polls_memory && idle_passes > spin_passes + kYieldPasses) {
      // A peer this late is not about to come: yielding on, the thread would
      // still take its turn on the core from the compute beside it (two
      // ranks' training threads on two cores). Nap, longer each time, up to
      // kLongestNap late at noticing it; a submitter ends a nap at once.
      nap_until_woken(nap);
      nap = std::min(nap * 2, kLongestNap);
      sleep = false;
    } else if (polls_memory || (running && !sleep && mode != WaitMode::kSpin)) {
      // Nothing will wake a sleep (or the policy says so): let a descheduled
      // peer run, then look again.
      sched_yield();
      sleep = sleep && !polls_memory;
    }
    if (sleep) {
      // Running ops: UCX's event fd wakes us (and a short timeout bounds the
      // wait for timeouts and the watchdog). Idle: a submitter or UCX does.
      // Woken with ops still running, by a UCX event or by the timeout: the
      // next news comes as an event again, so look once and sleep. Spinning
      // kSpinPasses after every 1 ms timeout, while a late peer's message is
      // awaited, took a tenth of the core from the compute it overlaps.
      sleep_until_woken(running && !only_woken_gated ? 1 : static_cast<int>(mesh_->options().watchdog.count()), true);
      if (running) spin_passes = kStreamPasses;
      idle_passes = 0;
    }
  }
}

void Engine::abort(const std::shared_ptr<CommState>& comm, const std::string& reason) {
  std::vector<std::shared_ptr<detail::OpState>> finished;
  {
    std::lock_guard lock(engine_mutex_);
    {
      std::lock_guard submit_lock(submit_mutex_);
      for (auto& op : submitted_) running_.push_back(op);
      submitted_.clear();
    }
    comm->broken = "aborted: " + reason;
    if (comm->id == 0) world_aborted_.store(true);
    for (auto& op : running_) {
      if (op->comm == comm) {
        fail(*op, std::make_exception_ptr(Error(Errc::kCanceled, fmt::format("{} aborted: {}", op->describe(), reason))));
        finished.push_back(op);
      }
    }
    std::erase_if(running_, [&](const auto& op) { return op->comm == comm; });
    for (auto& op : gated_) {
      if (op->comm == comm) {
        fail(*op, std::make_exception_ptr(Error(Errc::kCanceled, fmt::format("{} aborted: {}", op->describe(), reason))));
        finished.push_back(op);
      }
    }
    std::erase_if(gated_, [&](const auto& op) { return op->comm == comm; });
  }
  finish_all(finished);
}

}  // namespace dlop::sched
