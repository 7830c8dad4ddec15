#include "scheduler/communicator.hpp"

#include <fmt/format.h>

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <numeric>

#include "core/config.hpp"
#include "core/error.hpp"
#include "engine.hpp"
#include "op_state.hpp"

namespace dlop::sched {
namespace {

using coll::CollArgs;
using coll::CollKind;

bool reduces(CollKind kind) {
  return kind == CollKind::kAllreduce || kind == CollKind::kReduce || kind == CollKind::kReduceScatter ||
         kind == CollKind::kReduceScatterv;
}
bool rooted(CollKind kind) {
  return kind == CollKind::kBroadcast || kind == CollKind::kReduce || kind == CollKind::kGather ||
         kind == CollKind::kScatter;
}
bool per_rank_counts(CollKind kind) {
  return kind == CollKind::kAllgatherv || kind == CollKind::kReduceScatterv || kind == CollKind::kAlltoallv;
}

// Rejects what no algorithm can run, before any communication.
void validate(const CollArgs& args, int size) {
  const auto what = coll::kind_name(args.kind);
  if (reduces(args.kind)) coll::check_reduction(args.op, args.dtype);
  if (rooted(args.kind) && (args.root < 0 || args.root >= size)) {
    throw_error(Errc::kInvalidArgument, fmt::format("{}: root {} is not a rank of this communicator of {}", what,
                                                    args.root, size));
  }
  if (per_rank_counts(args.kind) && args.counts.size() != static_cast<std::size_t>(size)) {
    throw_error(Errc::kInvalidArgument, fmt::format("{}: {} counts for {} ranks", what, args.counts.size(), size));
  }
  if (args.kind == CollKind::kAlltoallv && args.send_counts.size() != static_cast<std::size_t>(size)) {
    throw_error(Errc::kInvalidArgument, fmt::format("alltoallv: {} send counts for {} ranks", args.send_counts.size(), size));
  }
}

}  // namespace

std::shared_ptr<Communicator> Communicator::create(transport::Bootstrap& bootstrap, Options options) {
  auto engine = std::make_shared<Engine>(
      bootstrap, options.check_signatures,
      Engine::Scheduling{.traffic_classes = options.traffic_classes, .chunk_bytes = options.chunk_bytes});
  std::vector<int> members(static_cast<std::size_t>(bootstrap.size()));
  std::iota(members.begin(), members.end(), 0);
  const auto timeout = options.timeout.count() > 0 ? options.timeout : config().timeout;
  std::shared_ptr<Communicator> comm(new Communicator(std::move(engine), std::move(members), 0, timeout));
  const ArenaId mine = next_arena_id();
  transport::Bytes bytes(sizeof mine);
  std::memcpy(bytes.data(), mine.data(), sizeof mine);
  ArenaIds ids;
  for (const auto& theirs : bootstrap.allgather(bytes, timeout)) {
    if (theirs.size() != sizeof mine) throw_error(Errc::kProtocol, "communicator: malformed arena id");
    std::memcpy(ids.emplace_back().data(), theirs.data(), sizeof mine);
  }
  comm->attach_host_arena(ids);
  return comm;
}

Communicator::Communicator(std::shared_ptr<Engine> engine, std::vector<int> members, int id,
                           std::chrono::milliseconds timeout)
    : engine_(std::move(engine)), members_(std::move(members)), state_(std::make_shared<CommState>()), timeout_(timeout) {
  state_->id = id;
  state_->group = std::make_unique<coll::Group>(engine_->mesh(), members_);
  rank_ = state_->group->rank();
}

Communicator::~Communicator() = default;

int Communicator::hosts() const { return state_->group->hosts(); }

Handle Communicator::enqueue(CollArgs args, const OpOptions& options, bool p2p, bool p2p_send, int peer,
                             std::uint32_t tag) {
  auto op = detail::make_op(engine_, state_, std::move(args), options, timeout_);
  op->p2p = p2p;
  op->p2p_send = p2p_send;
  op->peer = peer;
  op->tag = tag;
  Handle handle(op);
  engine_->submit(std::move(op));
  return handle;
}

Handle Communicator::submit(CollArgs args, OpOptions options) {
  validate(args, size());
  return enqueue(std::move(args), options, false, false, -1, 0);
}

Handle Communicator::allreduce(const void* send, void* recv, std::size_t count, coll::DataType dtype,
                               coll::ReduceOp op, OpOptions options) {
  CollArgs args{.kind = CollKind::kAllreduce, .send = send, .recv = recv, .count = count, .dtype = dtype, .op = op};
  validate(args, size());
  if (options.caller_waits) {
    if (auto handle = engine_->run_inline(state_, args, options, timeout_)) return std::move(*handle);
  }
  return enqueue(std::move(args), options, false, false, -1, 0);
}

Handle Communicator::broadcast(void* buffer, std::size_t count, coll::DataType dtype, int root, OpOptions options) {
  return submit({.kind = CollKind::kBroadcast, .send = buffer, .recv = buffer, .count = count, .dtype = dtype, .root = root},
                options);
}

Handle Communicator::reduce(const void* send, void* recv, std::size_t count, coll::DataType dtype, coll::ReduceOp op,
                            int root, OpOptions options) {
  return submit({.kind = CollKind::kReduce, .send = send, .recv = recv, .count = count, .dtype = dtype, .op = op,
                 .root = root},
                options);
}

Handle Communicator::allgather(const void* send, void* recv, std::size_t count, coll::DataType dtype,
                               OpOptions options) {
  return submit({.kind = CollKind::kAllgather, .send = send, .recv = recv, .count = count, .dtype = dtype}, options);
}

Handle Communicator::allgatherv(const void* send, void* recv, std::vector<std::size_t> counts, coll::DataType dtype,
                                OpOptions options) {
  return submit({.kind = CollKind::kAllgatherv, .send = send, .recv = recv, .dtype = dtype, .counts = std::move(counts)},
                options);
}

Handle Communicator::gather(const void* send, void* recv, std::size_t count, coll::DataType dtype, int root,
                            OpOptions options) {
  return submit({.kind = CollKind::kGather, .send = send, .recv = recv, .count = count, .dtype = dtype, .root = root},
                options);
}

Handle Communicator::scatter(const void* send, void* recv, std::size_t count, coll::DataType dtype, int root,
                             OpOptions options) {
  return submit({.kind = CollKind::kScatter, .send = send, .recv = recv, .count = count, .dtype = dtype, .root = root},
                options);
}

Handle Communicator::reduce_scatter(const void* send, void* recv, std::size_t count, coll::DataType dtype,
                                    coll::ReduceOp op, OpOptions options) {
  return submit({.kind = CollKind::kReduceScatter, .send = send, .recv = recv, .count = count, .dtype = dtype, .op = op},
                options);
}

Handle Communicator::reduce_scatterv(const void* send, void* recv, std::vector<std::size_t> counts,
                                     coll::DataType dtype, coll::ReduceOp op, OpOptions options) {
  return submit({.kind = CollKind::kReduceScatterv, .send = send, .recv = recv, .dtype = dtype, .op = op,
                 .counts = std::move(counts)},
                options);
}

Handle Communicator::alltoall(const void* send, void* recv, std::size_t count, coll::DataType dtype,
                              OpOptions options) {
  return submit({.kind = CollKind::kAlltoall, .send = send, .recv = recv, .count = count, .dtype = dtype}, options);
}

Handle Communicator::alltoallv(const void* send, std::vector<std::size_t> send_counts, void* recv,
                               std::vector<std::size_t> recv_counts, coll::DataType dtype, OpOptions options) {
  return submit({.kind = CollKind::kAlltoallv, .send = send, .recv = recv, .dtype = dtype,
                 .counts = std::move(recv_counts), .send_counts = std::move(send_counts)},
                options);
}

Handle Communicator::barrier(OpOptions options) { return submit({.kind = CollKind::kBarrier}, options); }

Handle Communicator::send(const void* data, std::size_t count, coll::DataType dtype, int peer, std::uint32_t tag,
                          OpOptions options) {
  if (peer < 0 || peer >= size()) throw_error(Errc::kInvalidArgument, fmt::format("send to rank {} of {}", peer, size()));
  return enqueue({.send = data, .count = count, .dtype = dtype}, options, true, true, peer, tag);
}

Handle Communicator::recv(void* data, std::size_t count, coll::DataType dtype, int peer, std::uint32_t tag,
                          OpOptions options) {
  if (peer >= size()) throw_error(Errc::kInvalidArgument, fmt::format("recv from rank {} of {}", peer, size()));
  return enqueue({.recv = data, .count = count, .dtype = dtype}, options, true, false, peer, tag);
}

std::shared_ptr<Communicator> Communicator::split(int color, int key) {
  // Everyone's (color, key, next free communicator id, arena id), gathered here.
  constexpr std::size_t kFields = 5;
  const ArenaId arena = next_arena_id();
  const std::int64_t mine[kFields] = {color, key, engine_->next_comm_id(), arena[0], arena[1]};
  std::vector<std::int64_t> all(kFields * static_cast<std::size_t>(size()));
  allgather(mine, all.data(), kFields, coll::DataType::kInt64, {.caller_waits = true}).wait();
  if (color < 0) return nullptr;
  const auto entry = [&](int r) { return &all[kFields * static_cast<std::size_t>(r)]; };
  std::vector<int> ranks;
  std::int64_t id = 0;
  for (int r = 0; r < size(); ++r) {
    if (entry(r)[0] != color) continue;
    ranks.push_back(r);
    id = std::max(id, entry(r)[2]);
  }
  std::stable_sort(ranks.begin(), ranks.end(), [&](int a, int b) { return entry(a)[1] < entry(b)[1]; });
  engine_->reserve_comm_id(static_cast<int>(id));
  std::vector<int> members;
  ArenaIds ids;
  for (const int r : ranks) {
    members.push_back(members_[static_cast<std::size_t>(r)]);
    ids.push_back({entry(r)[3], entry(r)[4]});
  }
  std::shared_ptr<Communicator> comm(new Communicator(engine_, std::move(members), static_cast<int>(id), timeout_));
  comm->attach_host_arena(ids);
  return comm;
}

std::shared_ptr<Communicator> Communicator::subgroup(const std::vector<int>& ranks, transport::Bootstrap& members) {
  if (ranks.size() != static_cast<std::size_t>(members.size()) || members.rank() < 0 ||
      members.rank() >= members.size() || ranks[static_cast<std::size_t>(members.rank())] != rank_) {
    throw_error(Errc::kInvalidArgument, fmt::format("subgroup: rank {} is not entry {} of the {} ranks given", rank_,
                                                    members.rank(), ranks.size()));
  }
  for (const int r : ranks) {
    if (r < 0 || r >= size()) throw_error(Errc::kInvalidArgument, fmt::format("subgroup: no rank {} of {}", r, size()));
  }
  // The largest next free id among the members is free on every pair of them,
  // which is all tags need: they only travel between members.
  // With each rank's arena id (attach_host_arena).
  const ArenaId arena = next_arena_id();
  const std::int64_t mine[3] = {engine_->next_comm_id(), arena[0], arena[1]};
  transport::Bytes bytes(sizeof mine);
  std::memcpy(bytes.data(), mine, sizeof mine);
  std::int64_t id = 0;
  ArenaIds ids;
  for (const auto& theirs : members.allgather(bytes, timeout_)) {
    std::int64_t value[3] = {};
    if (theirs.size() != sizeof value) throw_error(Errc::kProtocol, "subgroup: malformed communicator id");
    std::memcpy(value, theirs.data(), sizeof value);
    id = std::max(id, value[0]);
    ids.push_back({value[1], value[2]});
  }
  engine_->reserve_comm_id(static_cast<int>(id));
  std::vector<int> engine_ranks;
  for (const int r : ranks) engine_ranks.push_back(members_[static_cast<std::size_t>(r)]);
  std::shared_ptr<Communicator> comm(new Communicator(engine_, std::move(engine_ranks), static_cast<int>(id), timeout_));
  comm->attach_host_arena(ids);
  return comm;
}

Communicator::ArenaId Communicator::next_arena_id() {
  static std::atomic<std::int64_t> arenas_made{0};
  return {::getpid(), arenas_made.fetch_add(1)};
}

void Communicator::attach_host_arena(const ArenaIds& ids) {
  coll::Group& group = *state_->group;
  // The segment is named after its creator, the first local rank: unique on
  // the host and in the bootstrap's store.
  const ArenaId& creator = ids.at(static_cast<std::size_t>(group.local_ranks().front()));
  coll::attach_host_arena(group, engine_->bootstrap(), fmt::format("arena-{}-{}", creator[0], creator[1]), timeout_);
  state_->algorithms = {};  // in case anything was chosen before the arena existed
}

void Communicator::abort(const std::string& reason) { engine_->abort(state_, reason); }

std::shared_ptr<DataCredits> Communicator::data_credits() { return engine_->data_credits(); }

std::string_view traffic_class_name(TrafficClass traffic) {
  switch (traffic) {
    case TrafficClass::kGradient: return "gradient";
    case TrafficClass::kData: return "data";
    case TrafficClass::kBackground: return "background";
  }
  return "unknown";
}

}  // namespace dlop::sched
