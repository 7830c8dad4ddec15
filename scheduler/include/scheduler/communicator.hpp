// Communicator: the C++ API the c10d backend and the benchmarks use. Every
// collective returns a Handle at once; operations run on the process's engine
// (a progress thread, or the caller's thread while it waits) in submission
// order, with several in flight at once, each in its own tag space.
//
// Traffic classes: each operation is gradient (the default: the training
// step waits on it), data (offloaded batches, due at a step) or background.
// With DLOP_TRAFFIC_CLASSES on (the default), the engine progresses running
// operations by class, then (data) by deadline step, then in submission
// order; a data or background all-reduce above DLOP_CHUNK_BYTES runs as a
// sequence of chunks and waits between chunks while a more urgent collective
// is in flight
// (scheduler/src/chunked_task.hpp says why this cannot deadlock). Operations
// still *start* in submission order on every rank.
//
// Every rank must submit the same collectives in the same order with matching
// arguments (DLOP_DEBUG=detail cross-checks a signature of each one).
// Buffers must stay valid until the handle completes. Conventions for counts
// and buffers are those of collectives/coll_args.hpp.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string_view>
#include <vector>

#include "collectives/coll_args.hpp"
#include "core/config.hpp"
#include "scheduler/data_credits.hpp"
#include "scheduler/handle.hpp"
#include "scheduler/ready_event.hpp"
#include "transport/bootstrap.hpp"

namespace dlop::sched {

class Engine;
struct CommState;

enum class TrafficClass : std::uint8_t { kGradient, kData, kBackground };  // most urgent first
std::string_view traffic_class_name(TrafficClass traffic);                 // "gradient", "data", "background"

struct OpOptions {
  std::optional<std::chrono::milliseconds> timeout;  // default: the communicator's
  // The caller will wait on the handle at once: let it drive progress itself
  // instead of waking the progress thread (lower latency for blocking calls).
  bool caller_waits = false;
  TrafficClass traffic = TrafficClass::kGradient;
  std::uint64_t deadline_step = 0;  // kData: the training step that consumes the result (earlier goes first)
  // Set for buffers still being filled by a device stream: the operation
  // starts once the event is ready, and the operations submitted after it
  // wait behind it (start order stays the submission order). Null: ready.
  std::shared_ptr<const ReadyEvent> ready;
};

class Communicator : public std::enable_shared_from_this<Communicator> {
 public:
  struct Options {
    std::chrono::milliseconds timeout = std::chrono::milliseconds(0);  // 0: DLOP_TIMEOUT_MS
    bool check_signatures = config().debug_detail;                     // DLOP_DEBUG=detail
    bool traffic_classes = config().traffic_classes;                   // DLOP_TRAFFIC_CLASSES
    std::size_t chunk_bytes = config().chunk_bytes;                    // DLOP_CHUNK_BYTES
  };

  // Collective over the bootstrap's group: starts an engine for them and
  // returns the communicator of all its ranks. The bootstrap must outlive it.
  static std::shared_ptr<Communicator> create(transport::Bootstrap& bootstrap, Options options);
  static std::shared_ptr<Communicator> create(transport::Bootstrap& bootstrap) { return create(bootstrap, Options{}); }
  ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const { return rank_; }
  int size() const { return static_cast<int>(members_.size()); }
  int hosts() const;
  std::chrono::milliseconds timeout() const { return timeout_; }

  Handle allreduce(const void* send, void* recv, std::size_t count, coll::DataType dtype, coll::ReduceOp op,
                   OpOptions options = {});
  Handle broadcast(void* buffer, std::size_t count, coll::DataType dtype, int root, OpOptions options = {});
  Handle reduce(const void* send, void* recv, std::size_t count, coll::DataType dtype, coll::ReduceOp op, int root,
                OpOptions options = {});
  Handle allgather(const void* send, void* recv, std::size_t count, coll::DataType dtype, OpOptions options = {});
  Handle allgatherv(const void* send, void* recv, std::vector<std::size_t> counts, coll::DataType dtype,
                    OpOptions options = {});
  Handle gather(const void* send, void* recv, std::size_t count, coll::DataType dtype, int root,
                OpOptions options = {});
  Handle scatter(const void* send, void* recv, std::size_t count, coll::DataType dtype, int root,
                 OpOptions options = {});
  Handle reduce_scatter(const void* send, void* recv, std::size_t count, coll::DataType dtype, coll::ReduceOp op,
                        OpOptions options = {});
  Handle reduce_scatterv(const void* send, void* recv, std::vector<std::size_t> counts, coll::DataType dtype,
                         coll::ReduceOp op, OpOptions options = {});
  Handle alltoall(const void* send, void* recv, std::size_t count, coll::DataType dtype, OpOptions options = {});
  Handle alltoallv(const void* send, std::vector<std::size_t> send_counts, void* recv,
                   std::vector<std::size_t> recv_counts, coll::DataType dtype, OpOptions options = {});
  Handle barrier(OpOptions options = {});
  // Any collective described by args (the typed calls above build one).
  Handle submit(coll::CollArgs args, OpOptions options = {});

  // Point to point, outside the collective order. peer < 0 in recv: any rank
  // (Handle::source() tells which). Tags up to 2^32 - 1.
  Handle send(const void* data, std::size_t count, coll::DataType dtype, int peer, std::uint32_t tag,
              OpOptions options = {});
  Handle recv(void* data, std::size_t count, coll::DataType dtype, int peer, std::uint32_t tag,
              OpOptions options = {});
  // Collective over this communicator: ranks with equal color form a new
  // communicator, ordered by key then by rank here. color < 0: not a member
  // (returns null).
  std::shared_ptr<Communicator> split(int color, int key);
  // Collective over `ranks` only (ranks here, in the new communicator's
  // order), wired up through `members`, a bootstrap among exactly those ranks
  // (its rank: my index in `ranks`): unlike split, the other ranks take no
  // part. The new communicator shares this one's engine.
  std::shared_ptr<Communicator> subgroup(const std::vector<int>& ranks, transport::Bootstrap& members);

  // Credit for data traffic moved outside the engine, paced against this
  // engine's gradient collectives (shared by the communicators of one engine;
  // a data mover may hold it past them).
  std::shared_ptr<DataCredits> data_credits();

  // Fails every pending operation and refuses new ones (kCanceled).
  void abort(const std::string& reason);

 private:
  friend class Engine;
  Communicator(std::shared_ptr<Engine> engine, std::vector<int> members, int id, std::chrono::milliseconds timeout);
  // The intra-host shared segment (the shm algorithms' medium), mapped by the
  // ranks of each host right after the communicator is made. Each rank
  // contributes a (pid, number) id to the exchange that made the communicator;
  // ids[r] is rank r's.
  using ArenaId = std::array<std::int64_t, 2>;
  using ArenaIds = std::vector<ArenaId>;
  static ArenaId next_arena_id();
  void attach_host_arena(const ArenaIds& ids);
  Handle enqueue(coll::CollArgs args, const OpOptions& options, bool p2p, bool p2p_send, int peer, std::uint32_t tag);

  std::shared_ptr<Engine> engine_;
  std::vector<int> members_;  // rank here -> engine (mesh) rank
  int rank_ = -1;
  std::shared_ptr<CommState> state_;
  std::chrono::milliseconds timeout_;
};

}  // namespace dlop::sched
