// The trainer's side of offloading, for one trainer rank and one epoch at a
// time: which batches this rank gets (a pure function of seed and epoch),
// leasing them to the connected dlop-offloaders, reissuing what a dead or
// slow daemon held, and yielding every batch exactly once, in order, from a
// bounded pool of buffers.
//
// Driven by one thread (the consumer's): next() does the leasing and reads
// the daemons' answers, so nothing races with the caller's add_daemon(),
// restore() or release(); prepare_daemon() alone may run on another thread.
// Only the UCX transfers move in the background: a
// progress thread, owned here and joined on destruction, lets a batch land
// in its buffer while the consumer computes.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "offload/offload_client.hpp"

namespace dlop::offload {

// Every daemon of a LeaseManager is gone and none came back within
// no_daemon_timeout: the caller may make the rest of the epoch itself
// (dlop.NoOffloaderError in Python; its code stays kPeerDead for C++ callers
// that test codes).
class NoOffloaderError : public Error {
 public:
  explicit NoOffloaderError(const std::string& what) : Error(Errc::kPeerDead, what) {}
};

// A daemon failed a batch for one of its samples under the raise policy; the
// message names the sample and the reason, as the daemon did (dlop.SampleError
// in Python, as when the batch is made locally).
class BatchSampleError : public Error {
 public:
  explicit BatchSampleError(const std::string& what) : Error(Errc::kInvalidArgument, what) {}
};

// Which samples make which batch of one rank in one epoch. DistributedSampler's
// rules: the epoch's order (a seeded shuffle of 0..N-1, or 0..N-1) is cut to a
// multiple of `world` when drop_last, else padded with its own first samples
// up to one; rank r takes positions r, r+world, ... Its samples are then cut
// into batches; with drop_last the last incomplete batch is dropped too (the
// DataLoader's drop_last). Every rank therefore gets the same batch count, so
// DDP's collectives never wait for a rank that ran out.
//
// With shard_sizes (a source made of shards: the samples of shard k follow
// those of shard k-1), the order is by shard instead: the shards' order is
// shuffled (or kept, without shuffle), each shard's samples stay in order,
// and this sequence is cut into batches dealt round-robin: rank r takes
// batches r, r+world, ... Each batch is thus a contiguous run of one shard
// (or of the end of one and the start of the next), which a streamed source
// reads with one request. The counts stay DistributedSampler's: the sequence
// is cut to, or padded (with its own start) up to, a multiple of world, and
// the last round, when shorter than world batches, is split into world equal
// parts, so every rank gets the same number of batches and of samples.
struct EpochPlan {
  std::uint64_t dataset_size = 0;
  std::uint32_t batch_size = 1;
  std::uint64_t seed = 0;
  bool shuffle = true;
  bool drop_last = false;
  std::uint32_t rank = 0;
  std::uint32_t world = 1;
  // Samples per shard, in index order (their sum is dataset_size); empty:
  // the sample-by-sample order above.
  std::vector<std::uint64_t> shard_sizes;

  // The whole epoch's order before sharding (a Fisher-Yates shuffle, of the
  // samples or of the shards, drawn from SampleRng keyed by seed and epoch
  // only).
  std::vector<std::uint64_t> order(std::uint64_t epoch) const;
  // This rank's batches, each a list of sample indices.
  std::vector<std::vector<std::uint64_t>> batches(std::uint64_t epoch) const;
  std::size_t batch_count() const;
  // Names the shard sizes in a cursor: 0 for the sample order, else a hash
  // of the sizes.
  std::uint64_t shards_digest() const;
};

// Where an epoch stands: enough to resume it elsewhere with the same
// following batches. `position` is the next batch to be yielded; the rest is
// checked on restore so a cursor is never applied to another plan.
struct Cursor {
  std::uint64_t epoch = 0;
  std::uint64_t position = 0;
  std::uint64_t seed = 0;
  std::uint64_t dataset_size = 0;
  std::uint32_t batch_size = 0;
  std::uint32_t rank = 0;
  std::uint32_t world = 1;
  bool shuffle = true;
  bool drop_last = false;
  std::uint64_t shards = 0;  // EpochPlan::shards_digest()
  bool operator==(const Cursor&) const = default;
};

// Where the pool's buffers come from: `bytes` (a multiple of 4096) aligned to
// at least 64, held until the returned owner drops it. A trainer that uploads
// its batches to an accelerator passes the device's pinned-host allocator
// (dlop._C fills it in from torch), so that an upload reads the batch's
// buffer itself, asynchronously, with no copy into other pinned memory.
using PoolAllocator = std::function<std::shared_ptr<std::byte>(std::size_t bytes)>;

// The default PoolAllocator: page-aligned memory, page-locked where
// RLIMIT_MEMLOCK allows (plain memory otherwise).
std::shared_ptr<std::byte> page_locked_memory(std::size_t bytes);

struct LeaseOptions {
  OffloadConfig config;  // source, transform, seed, batch_size: sent to every daemon
  std::string token;
  bool shuffle = true;
  bool drop_last = false;
  std::uint32_t rank = 0;
  std::uint32_t world = 1;
  // The source's samples per shard, for the shard-ordered plan (EpochPlan);
  // empty: the sample order. add_daemon checks that they add up to the
  // daemon's dataset size.
  std::vector<std::uint64_t> shard_sizes;
  // Batches leased ahead of the consumer (the window past the next one to yield).
  std::size_t prefetch = 4;
  // Leases one daemon holds at once; a daemon gets its next one as soon as it
  // completes one, so a faster daemon makes more of the epoch.
  std::size_t per_daemon = 2;
  // A lease this old is canceled and given to another daemon: a daemon that
  // hangs without closing its socket must not stall the epoch forever.
  std::chrono::milliseconds lease_timeout{30'000};
  // With no daemon left, next() waits this long for add_daemon() and then
  // throws kPeerDead (the caller's cue to fall back to local work).
  std::chrono::milliseconds no_daemon_timeout{10'000};
  // Connecting and configuring one daemon gives up after this.
  std::chrono::milliseconds connect_timeout{10'000};
  // Paces the batches' UCX transfers (OffloadClient::Options::pacer); told
  // the step each time a batch is yielded. null: unpaced.
  std::shared_ptr<DataPacer> pacer;
  // A daemon on this host may write batches straight into the pool
  // (OffloadClient::Options::direct); false: always over UCX.
  bool direct = true;
  // The pool's memory; empty: page_locked_memory. Called on the thread that
  // drives the manager (add_daemon, next).
  PoolAllocator allocator;
};

// A yielded batch: `count` samples (fewer than the plan's when the skip
// policy left some out) in a pool buffer the caller holds until release().
struct Batch {
  std::uint64_t position = 0;  // the batch id: its index in this rank's epoch
  std::uint32_t count = 0;
  std::size_t slot = 0;  // the pool buffer, for release()
  std::size_t bytes = 0;  // written into it
  // Native: the layout's images and labels. The Python path: `images` is the
  // batch blob (dlop.data._python_job) of `bytes`, `labels` null.
  std::byte* images = nullptr;
  std::int64_t* labels = nullptr;
  std::int64_t* lengths = nullptr;  // native, when the layout has lengths
  std::vector<std::uint64_t> indices;  // the samples asked for
  std::vector<std::uint64_t> skipped;  // those left out under the skip policy
};

// A daemon connected, authenticated and configured by prepare_daemon(), not
// used yet: adopt_daemon() gives it work.
class PreparedDaemon {
 public:
  PreparedDaemon(PreparedDaemon&&) noexcept;
  PreparedDaemon& operator=(PreparedDaemon&&) noexcept;
  ~PreparedDaemon();
  std::string address() const;

 private:
  friend class LeaseManager;
  explicit PreparedDaemon(std::unique_ptr<OffloadClient> client);
  std::unique_ptr<OffloadClient> client_;
};

class LeaseManager {
 public:
  explicit LeaseManager(LeaseOptions options);
  ~LeaseManager();
  LeaseManager(const LeaseManager&) = delete;
  LeaseManager& operator=(const LeaseManager&) = delete;

  // Connects, authenticates and configures a daemon; it gets work on the next
  // next(). Throws what OffloadClient throws, and kInvalidArgument when its
  // layout differs from the other daemons'. Any time, also mid-epoch.
  void add_daemon(const std::string& host, std::uint16_t port);
  // add_daemon() in two halves, so that the slow one (connecting, and the
  // daemon starting its Python workers: seconds) can run on another thread
  // while the consumer trains: prepare_daemon() touches nothing next() uses;
  // adopt_daemon(), on the driving thread, checks its layout and gives it work.
  PreparedDaemon prepare_daemon(const std::string& host, std::uint16_t port) const;
  void adopt_daemon(PreparedDaemon daemon);
  std::size_t live_daemons() const;

  // Starts `epoch` from its first batch; leases of the previous one are canceled.
  void set_epoch(std::uint64_t epoch);
  // The next batch in order, or nullopt at the end of the epoch. Throws
  // NoOffloaderError when no daemon answered for no_daemon_timeout, and the daemon's
  // error when a batch failed under the raise policy. While it waits it calls
  // while_waiting about every 100 ms; what that throws leaves next() with the
  // leases as they were (a later next() goes on), so a caller can give up on
  // a signal.
  std::optional<Batch> next(const std::function<void()>& while_waiting = {});
  // Gives a yielded batch's buffer back to the pool; the next lease may
  // write it at once, so a caller whose device still reads it (an upload
  // queued on a stream) releases only once that read has passed.
  void release(std::size_t slot);
  // Closes every daemon's connection as a dropped client does (its last
  // answers taken in, see OffloadClient::close_quietly), keeping the buffers
  // that yielded batches still view: for a process that exits with them.
  // A later next() finds no daemon.
  void close();

  Cursor state() const;
  // Resumes the cursor's epoch at its position (kInvalidArgument if its plan
  // differs from this manager's).
  void restore(const Cursor& cursor);

  // Needs a configured daemon (the dataset size and layout come from it).
  const BatchLayout& layout() const;
  const EpochPlan& plan() const;
  std::size_t batch_count() const;
  // Leases given out and reissued so far (for tests and stats).
  std::uint64_t leases_issued() const;
  std::uint64_t leases_reissued() const;
  // Batches each daemon completed (by add_daemon order), dead ones included.
  std::vector<std::uint64_t> completed_per_daemon() const;
  // Each daemon's busy fraction (by add_daemon order), as its latest
  // BATCH_READY to this manager gave it (OffloadClient::busy()); NaN for a
  // daemon that sent none yet, or that is dead.
  std::vector<double> busy_per_daemon() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace dlop::offload
