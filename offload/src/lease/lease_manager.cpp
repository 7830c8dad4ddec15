// LeaseManager: a window of `prefetch` batches past the consumer is leased to
// the daemons, each daemon holding at most per_daemon leases (so work is
// pulled by whoever frees up first). Batch ids are positions in this rank's
// epoch: whichever lease of a position completes first fills it, any later
// one is a duplicate and its buffer goes straight back to the pool.
#include "offload/lease_manager.hpp"

#include <poll.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <numeric>
#include <thread>

#include "core/error.hpp"
#include "core/log.hpp"
#include "core/trace.hpp"
#include "lease_pool.hpp"
#include "transport/progress_thread.hpp"

namespace dlop::offload {
namespace {

using Clock = std::chrono::steady_clock;
constexpr int kFailuresToDrop = 3;  // a daemon's own failures in a row before it is dropped

enum class PosState { kPending, kLeased, kFilled, kYielded };

struct Position {
  PosState state = PosState::kPending;
  std::uint64_t lease = 0;  // the current lease while kLeased
  std::size_t slot = 0;     // kFilled / kYielded
  Completion done;
  Clock::time_point landed;  // kFilled: when its completion was seen (for the trace)
};

// A lease's life in the trace: from PRODUCE to its answer, by outcome.
void trace_lease(std::uint64_t id, std::uint64_t position, const std::string& daemon, Clock::time_point issued,
                 const Completion& c, bool used) {
  const char* outcome = c.status == Completion::Status::kReady ? (used ? "landed" : "duplicate")
                        : c.status == Completion::Status::kFailed ? "failed"
                                                                   : "canceled";
  trace::span("lease " + std::to_string(position), "data", issued, Clock::now(),
              {{"lease", static_cast<std::int64_t>(id)},
               {"batch", static_cast<std::int64_t>(position)},
               {"daemon", daemon},
               {"bytes", static_cast<std::int64_t>(c.bytes)},
               {"outcome", std::string(outcome)}});
}

struct Daemon {
  std::unique_ptr<OffloadClient> client;
  bool dead = false;
  // Its last answer refused a lease as busy (its lease limit, or draining
  // before it exits): it gets no new lease while it holds others, whose
  // answers come next; without this, a daemon that makes one batch at a time
  // would be handed the refused batch straight back, one round trip each.
  bool paused = false;
  std::uint64_t completed = 0;
  // Its own failures (kInternal: a worker died, its sends to us fail) since
  // its last batch: past kFailuresToDrop it is dropped, since a daemon that
  // fails every batch would otherwise be asked again forever.
  int failed_in_a_row = 0;
  // Since when it has held leases without answering any: set by its first
  // lease after it held none, and by each answer.
  Clock::time_point silent_since;
};

struct Lease {
  std::size_t daemon;
  std::uint64_t generation;  // set_epoch/restore start a new one; older leases are orphans
  std::uint64_t position;
  std::size_t slot;
  Clock::time_point issued;
};

}  // namespace

struct LeaseManager::Impl {
  LeaseOptions opt;
  std::optional<BatchLayout> layout;
  EpochPlan plan;
  // One worker for every daemon's client, progressed by this thread, so a
  // batch over UCX lands while the consumer is away from next() (lease ids
  // are unique across the clients, as a shared worker needs). Made with the
  // manager, so that prepare_daemon() on another thread finds it; outlives
  // the clients.
  std::shared_ptr<transport::ProgressThread> progress;
  // Allocated once the layout is known; the Python path's slots start empty
  // and grow to the largest batch they were asked to hold. Outlives the
  // daemons (~Impl).
  LeasePool pool;
  std::vector<Daemon> daemons;
  std::map<std::uint64_t, Lease> leases;
  std::uint64_t epoch = 0, generation = 0, next = 0, next_lease = 1;
  std::uint64_t issued = 0, reissued = 0;
  std::vector<std::vector<std::uint64_t>> batches;  // of the current epoch, built once the plan is known
  std::vector<Position> positions;
  bool built = false;

  ~Impl() { daemons.clear(); }  // each client waits until no buffer of ours can be written

  bool python() const { return layout->dtype == protocol::Dtype::kPythonBlob; }

  // Before the layout is taken: an allocation that fails leaves the manager as it was.
  void allocate_pool(const BatchLayout& l) {
    // The consumer holds up to two yielded batches (the one it works on and
    // the one it just asked for) besides the window.
    const bool blobs = l.dtype == protocol::Dtype::kPythonBlob;
    pool.allocate(opt.prefetch + 2, blobs ? 0 : l.batch_bytes, opt.allocator);
  }

  void build() {
    if (built || !layout) return;
    batches = plan.batches(epoch);
    positions.assign(batches.size(), Position{});
    for (std::uint64_t i = 0; i < std::min<std::uint64_t>(next, positions.size()); ++i) {
      positions[i].state = PosState::kYielded;
    }
    built = true;
  }

  // Drops the current epoch's progress: leases become orphans (canceled; their
  // buffers come back with their completions), filled batches free their buffers.
  void reset(std::uint64_t new_epoch, std::uint64_t position) {
    for (auto& [id, l] : leases) {
      if (l.generation != generation) continue;
      auto& d = daemons[l.daemon];
      if (d.dead) continue;
      try {
        d.client->cancel(id);
      } catch (const Error& e) {
        if (e.code() != Errc::kPeerDead) throw;
        on_dead(l.daemon);
        return reset(new_epoch, position);
      }
    }
    for (auto& p : positions) {
      if (p.state == PosState::kFilled) pool.give_back(p.slot);
    }
    ++generation;
    epoch = new_epoch;
    next = position;
    if (opt.pacer) opt.pacer->set_step(position);
    built = false;
    build();
  }

  std::optional<std::size_t> idle_daemon() const {
    std::optional<std::size_t> best;
    for (std::size_t i = 0; i < daemons.size(); ++i) {
      const auto& d = daemons[i];
      if (d.dead || (d.paused && d.client->in_flight() > 0) || d.client->in_flight() >= opt.per_daemon) continue;
      if (!best || d.client->in_flight() < daemons[*best].client->in_flight()) best = i;
    }
    return best;
  }

  // A dead daemon writes no buffer any more: its leases' buffers are free and
  // their positions go back to pending, to be leased to someone else.
  void on_dead(std::size_t d) { drop(d, "is gone", false); }

  // `alive`: the daemon may still write the buffers of its leases (dropped
  // for its silence, not for a closed connection).
  void drop(std::size_t d, const std::string& why, bool alive) {
    daemons[d].dead = true;
    log().warn("offload: daemon {} {}; its leases are reissued", daemons[d].client->address(), why);
    for (auto it = leases.begin(); it != leases.end();) {
      if (it->second.daemon != d) {
        ++it;
        continue;
      }
      if (alive) {
        pool.retire(it->second.slot);
      } else {
        pool.give_back(it->second.slot);
      }
      if (it->second.generation == generation) {
        auto& p = positions[it->second.position];
        if (p.state == PosState::kLeased && p.lease == it->first) {
          p.state = PosState::kPending;
          ++reissued;
        }
      }
      it = leases.erase(it);
    }
  }

  void issue() {
    const std::uint64_t end = std::min<std::uint64_t>(positions.size(), next + opt.prefetch);
    for (std::uint64_t pos = next; pos < end; ++pos) {
      if (positions[pos].state != PosState::kPending) continue;
      const auto d = idle_daemon();
      const auto slot = pool.free_slot();
      if (!d || !slot) return;
      const std::uint64_t id = next_lease++;
      if (daemons[*d].client->in_flight() == 0) daemons[*d].silent_since = Clock::now();
      try {
        if (python()) {
          daemons[*d].client->produce(id, epoch, pos, batches[pos],
                                      [this, slot = *slot](std::size_t bytes) { return pool.grow(slot, bytes); });
        } else {
          daemons[*d].client->produce(id, epoch, pos, batches[pos], pool.data(*slot), layout->batch_bytes);
        }
      } catch (const Error& e) {
        if (e.code() != Errc::kPeerDead) throw;
        on_dead(*d);
        --pos;  // lease this position to another daemon
        continue;
      }
      pool.take(*slot);
      leases[id] = Lease{*d, generation, pos, *slot, Clock::now()};
      positions[pos].state = PosState::kLeased;
      positions[pos].lease = id;
      ++issued;
    }
  }

  void on_completion(std::size_t d, Completion c) {
    const auto it = leases.find(c.lease);
    if (it == leases.end()) return;  // cannot happen: the client reports only our leases
    const Lease l = it->second;
    leases.erase(it);
    daemons[d].silent_since = Clock::now();
    if (c.status == Completion::Status::kReady) {
      ++daemons[d].completed;
      daemons[d].failed_in_a_row = 0;
    }
    daemons[d].paused = c.status == Completion::Status::kFailed && c.error_code == protocol::ErrorCode::kBusy;
    Position* p = l.generation == generation ? &positions[l.position] : nullptr;
    const bool open = p != nullptr && (p->state == PosState::kLeased || p->state == PosState::kPending);
    if (trace::enabled()) {
      trace_lease(c.lease, l.position, daemons[d].client->address(), l.issued, c,
                  c.status == Completion::Status::kReady && open);
    }
    if (c.status == Completion::Status::kReady && open) {
      if (p->state == PosState::kLeased && p->lease != c.lease) cancel_lease(p->lease);  // an orphan won
      p->state = PosState::kFilled;
      p->slot = l.slot;
      p->done = std::move(c);
      p->landed = Clock::now();
      return;
    }
    pool.give_back(l.slot);  // a duplicate, a cancellation or a failure: the buffer is unused
    if (c.status == Completion::Status::kFailed && open) {
      if (c.error_code == protocol::ErrorCode::kSample) {
        throw BatchSampleError("offload: batch " + std::to_string(l.position) + " failed: " + c.error);
      }
      log().warn("offload: daemon {} failed batch {} ({}); reissuing", daemons[d].client->address(), l.position,
                 c.error);
      if (p->lease == c.lease) p->state = PosState::kPending;
      ++reissued;
    }
    if (c.status == Completion::Status::kFailed && c.error_code == protocol::ErrorCode::kInternal &&
        !daemons[d].dead && ++daemons[d].failed_in_a_row >= kFailuresToDrop) {
      drop(d, fmt::format("failed {} batches in a row (the last: {})", kFailuresToDrop, c.error), true);
    }
  }

  void cancel_lease(std::uint64_t id) {
    const auto it = leases.find(id);
    if (it == leases.end()) return;
    auto& d = daemons[it->second.daemon];
    if (d.dead) return;
    try {
      d.client->cancel(id);
    } catch (const Error& e) {
      if (e.code() != Errc::kPeerDead) throw;
      on_dead(it->second.daemon);
    }
  }

  // A lease past its timeout is canceled and its position leased again; the
  // old lease keeps its buffer until it completes, and wins if it is first.
  void expire() {
    const auto now = Clock::now();
    std::vector<std::uint64_t> late;
    for (const auto& [id, l] : leases) {
      if (l.generation != generation || now - l.issued < opt.lease_timeout) continue;
      auto& p = positions[l.position];
      if (p.state == PosState::kLeased && p.lease == id) late.push_back(id);
    }
    for (const auto id : late) {
      const auto pos = leases.at(id).position;
      log().warn("offload: lease of batch {} timed out on {}; reissuing", pos,
                 daemons[leases.at(id).daemon].client->address());
      positions[pos].state = PosState::kPending;
      ++reissued;
      cancel_lease(id);
    }
    // Reissuing alone would wait forever on a daemon that takes leases and
    // never answers (its socket open, its workers stuck): after two lease
    // timeouts of silence it is dropped, and with none left next() throws
    // NoOffloaderError in time.
    for (std::size_t d = 0; d < daemons.size(); ++d) {
      auto& daemon = daemons[d];
      if (daemon.dead || daemon.client->in_flight() == 0 || now - daemon.silent_since < 2 * opt.lease_timeout) {
        continue;
      }
      drop(d,
           fmt::format("answered none of its leases in {} ms (two lease timeouts; a longer lease_timeout suits "
                       "slower batches)",
                       std::chrono::duration_cast<std::chrono::milliseconds>(now - daemon.silent_since).count()),
           true);
    }
  }

  // Reads every completion that arrived, without waiting; whether there was
  // any, and the daemons still holding leases.
  bool collect(std::vector<std::size_t>& busy) {
    bool got = false;
    busy.clear();
    for (std::size_t i = 0; i < daemons.size(); ++i) {
      if (daemons[i].dead) continue;
      try {
        while (auto c = daemons[i].client->poll()) {
          on_completion(i, std::move(*c));
          got = true;
        }
        if (!daemons[i].dead && daemons[i].client->in_flight() > 0) busy.push_back(i);
      } catch (const Error& e) {
        if (e.code() != Errc::kPeerDead) throw;
        on_dead(i);
        got = true;
      }
    }
    return got;
  }

  // Before a batch is yielded: completions in, and the window past it leased.
  // Without this a consumer that never waits (its batches already landed)
  // would lease nothing new until it ran dry, one batch ahead at most.
  void top_up() {
    if (!built) return;
    std::vector<std::size_t> busy;
    collect(busy);
    issue();
  }

  // Reads every completion that arrived; if none had any, sleeps until one
  // of the busy daemons has something (one poll over all of them: a short
  // timeout per daemon would wake the trainer many times per batch).
  void pump() {
    // Before looking at any client: what lands after the look wakes the poll below.
    if (progress) progress->drain_activity();
    std::vector<std::size_t> busy;
    if (collect(busy) || busy.empty()) return;
    std::vector<pollfd> fds;
    for (const std::size_t i : busy) {
      const std::vector<int> wake = daemons[i].client->wake_fds();
      if (wake.empty()) return;  // something arrived meanwhile: the next pump reads it
      for (const int fd : wake) fds.push_back({fd, POLLIN, 0});
    }
    // Bounded, so lease timeouts and new daemons are still looked at.
    ::poll(fds.data(), fds.size(), kSleepMs);
  }

  static constexpr int kSleepMs = 50;
};

// A daemon that could not connect back over UCX is asked this many times, this far apart.
constexpr int kConfigureTries = 3;
constexpr std::chrono::milliseconds kConfigurePause{500};

// How often next() calls its while_waiting while it waits.
constexpr std::chrono::milliseconds kWhileWaitingEvery{100};

LeaseManager::LeaseManager(LeaseOptions options) : impl_(std::make_unique<Impl>()) {
  auto& o = options;
  if (o.prefetch == 0 || o.per_daemon == 0 || o.config.batch_size == 0 || o.world == 0 || o.rank >= o.world) {
    throw_error(Errc::kInvalidArgument, "LeaseManager: need prefetch, per_daemon, batch_size > 0 and rank < world");
  }
  impl_->plan =
      EpochPlan{0, o.config.batch_size, o.config.seed, o.shuffle, o.drop_last, o.rank, o.world, o.shard_sizes};
  impl_->opt = std::move(options);
  impl_->progress = std::make_shared<transport::ProgressThread>(OffloadClient::make_worker(), "dlop-lease-ucx");
}

LeaseManager::~LeaseManager() = default;

PreparedDaemon::PreparedDaemon(std::unique_ptr<OffloadClient> client) : client_(std::move(client)) {}
PreparedDaemon::PreparedDaemon(PreparedDaemon&&) noexcept = default;
PreparedDaemon& PreparedDaemon::operator=(PreparedDaemon&&) noexcept = default;
PreparedDaemon::~PreparedDaemon() = default;
std::string PreparedDaemon::address() const { return client_ ? client_->address() : std::string(); }

void LeaseManager::add_daemon(const std::string& host, std::uint16_t port) { adopt_daemon(prepare_daemon(host, port)); }

PreparedDaemon LeaseManager::prepare_daemon(const std::string& host, std::uint16_t port) const {
  const auto& m = *impl_;
  OffloadClient::Options co;
  co.name = "dlop rank " + std::to_string(m.opt.rank);
  co.timeout = m.opt.connect_timeout;
  co.python_load_timeout = std::max(m.opt.connect_timeout, m.opt.lease_timeout);
  co.progress = m.progress;
  co.pacer = m.opt.pacer;
  co.direct = m.opt.direct;
  const auto deadline = Clock::now() + m.opt.connect_timeout;
  for (int attempt = 1;; ++attempt) {
    auto client = std::make_unique<OffloadClient>(host, port, m.opt.token, co);
    try {
      client->configure(m.opt.config);
      return PreparedDaemon(std::move(client));
    } catch (const Error& e) {
      // The daemon's UCX could not reach this worker ("Destination is
      // unreachable"). Seen only while many other jobs started and stopped on
      // the host, cause unknown: one failed connection does not lose a daemon.
      if (e.code() != Errc::kTransport || attempt == kConfigureTries || Clock::now() + kConfigurePause > deadline) {
        throw;
      }
      log().warn("offload: {}; trying again ({} of {})", e.what(), attempt + 1, kConfigureTries);
      std::this_thread::sleep_for(kConfigurePause);
    }
  }
}

void LeaseManager::adopt_daemon(PreparedDaemon daemon) {
  auto& m = *impl_;
  if (!daemon.client_) throw_error(Errc::kInvalidArgument, "offload: this prepared daemon was adopted already");
  auto client = std::move(daemon.client_);
  const BatchLayout& got = client->layout();
  const auto& shards = m.opt.shard_sizes;
  if (const auto sum = std::accumulate(shards.begin(), shards.end(), std::uint64_t{0});
      !shards.empty() && sum != got.dataset_size) {
    throw_error(Errc::kInvalidArgument, "offload: daemon " + client->address() + " sees " +
                                            std::to_string(got.dataset_size) + " samples, the shards here hold " +
                                            std::to_string(sum));
  }
  if (m.layout) {
    const auto& l = *m.layout;
    if (got.dataset_size != l.dataset_size || got.dtype != l.dtype || got.batch_bytes != l.batch_bytes ||
        got.sample_bytes != l.sample_bytes || got.labels_offset != l.labels_offset || got.shape != l.shape ||
        got.label_width != l.label_width || got.lengths_offset != l.lengths_offset) {
      throw_error(Errc::kInvalidArgument, "offload: daemon " + client->address() +
                                              " sees another dataset or layout than the other daemons");
    }
  } else {
    m.allocate_pool(got);
    m.layout = got;
    m.plan.dataset_size = got.dataset_size;
    m.build();
  }
  m.daemons.push_back(Daemon{std::move(client), false, 0});
}

std::size_t LeaseManager::live_daemons() const {
  return static_cast<std::size_t>(
      std::count_if(impl_->daemons.begin(), impl_->daemons.end(), [](const Daemon& d) { return !d.dead; }));
}

void LeaseManager::set_epoch(std::uint64_t epoch) { impl_->reset(epoch, 0); }

std::optional<Batch> LeaseManager::next(const std::function<void()>& while_waiting) {
  auto& m = *impl_;
  const auto asked = Clock::now();
  std::optional<Clock::time_point> alone_since;
  auto looked = asked;
  m.top_up();
  while (true) {
    if (while_waiting && Clock::now() - looked >= kWhileWaitingEvery) {
      while_waiting();
      looked = Clock::now();
    }
    if (m.built && m.next >= m.positions.size()) return std::nullopt;
    if (m.built && m.positions[m.next].state == PosState::kFilled) {
      Position& p = m.positions[m.next];
      p.state = PosState::kYielded;
      Batch b;
      b.position = m.next++;
      if (m.opt.pacer) m.opt.pacer->set_step(b.position);
      b.count = p.done.count;
      b.slot = p.slot;
      b.bytes = p.done.bytes;
      b.images = m.pool.data(p.slot);
      b.labels = m.python() ? nullptr : reinterpret_cast<std::int64_t*>(b.images + m.layout->labels_offset);
      if (!m.python() && m.layout->lengths_offset != 0) {
        b.lengths = reinterpret_cast<std::int64_t*>(b.images + m.layout->lengths_offset);
      }
      b.indices = m.batches[b.position];
      for (const auto& s : p.done.skipped) b.skipped.push_back(s.index);
      if (trace::enabled()) {
        // The consumer's wait for this batch (its step's data stall), and
        // how long the batch had waited for the consumer.
        const auto now = Clock::now();
        const auto position = static_cast<std::int64_t>(b.position);
        trace::span("data wait", "data", asked, now, {{"batch", position}});
        trace::span("ready " + std::to_string(b.position), "data", std::min(p.landed, now), now,
                    {{"batch", position}, {"consumed", std::string("yes")}});
      }
      return b;
    }
    if (live_daemons() == 0) {
      if (!alone_since) alone_since = Clock::now();
      if (Clock::now() - *alone_since >= m.opt.no_daemon_timeout) {
        throw NoOffloaderError("dlop: no dlop-offloader left (waited " +
                               std::to_string(m.opt.no_daemon_timeout.count()) + " ms for one to answer)");
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
      continue;
    }
    alone_since.reset();
    m.issue();
    m.pump();
    m.expire();
  }
}

void LeaseManager::close() { impl_->daemons.clear(); }

void LeaseManager::release(std::size_t slot) {
  if (!impl_->pool.in_use(slot)) {
    throw_error(Errc::kInvalidArgument, "LeaseManager::release: slot " + std::to_string(slot) + " is not in use");
  }
  impl_->pool.give_back(slot);
}

Cursor LeaseManager::state() const {
  const auto& m = *impl_;
  return Cursor{m.epoch,     m.next,       m.plan.seed,    m.plan.dataset_size, m.plan.batch_size,
                m.plan.rank, m.plan.world, m.plan.shuffle, m.plan.drop_last,    m.plan.shards_digest()};
}

void LeaseManager::restore(const Cursor& c) {
  Cursor mine = state();
  mine.epoch = c.epoch;
  mine.position = c.position;
  // A cursor taken before any daemon answered has no dataset size yet.
  if (c.dataset_size == 0 || mine.dataset_size == 0) mine.dataset_size = c.dataset_size;
  if (!(mine == c)) {
    throw_error(Errc::kInvalidArgument,
                "LeaseManager::restore: the cursor belongs to another plan "
                "(seed, dataset size, batch size, rank, world, shuffle, drop_last or shards differ)");
  }
  impl_->reset(c.epoch, c.position);
}

const BatchLayout& LeaseManager::layout() const {
  if (!impl_->layout) throw_error(Errc::kInvalidArgument, "LeaseManager: no daemon configured yet");
  return *impl_->layout;
}
const EpochPlan& LeaseManager::plan() const { return impl_->plan; }
std::size_t LeaseManager::batch_count() const {
  layout();
  return impl_->plan.batch_count();
}
std::uint64_t LeaseManager::leases_issued() const { return impl_->issued; }
std::uint64_t LeaseManager::leases_reissued() const { return impl_->reissued; }
std::vector<std::uint64_t> LeaseManager::completed_per_daemon() const {
  std::vector<std::uint64_t> v;
  for (const auto& d : impl_->daemons) v.push_back(d.completed);
  return v;
}
std::vector<double> LeaseManager::busy_per_daemon() const {
  std::vector<double> v;
  for (const auto& d : impl_->daemons) {
    const auto& busy = d.client->busy();
    v.push_back(!d.dead && busy ? busy->fraction : std::numeric_limits<double>::quiet_NaN());
  }
  return v;
}

}  // namespace dlop::offload
