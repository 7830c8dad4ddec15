#include "scheduler/communicator.hpp"

#include <fmt/format.h>

#include <algorithm>
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
  auto engine = std::make_shared<Engine>(bootstrap, options.check_signatures);
  std::vector<int> members(static_cast<std::size_t>(bootstrap.size()));
  std::iota(members.begin(), members.end(), 0);
  const auto timeout = options.timeout.count() > 0 ? options.timeout : config().timeout;
  return std::shared_ptr<Communicator>(new Communicator(std::move(engine), std::move(members), 0, timeout));
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
  auto op = std::make_shared<detail::OpState>();
  op->engine = engine_;
  op->comm = state_;
  op->args = std::move(args);
  op->p2p = p2p;
  op->p2p_send = p2p_send;
  op->peer = peer;
  op->tag = tag;
  op->caller_waits = options.caller_waits;
  op->timeout = options.timeout.value_or(timeout_);
  op->deadline = std::chrono::steady_clock::now() + op->timeout;
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
  return submit({.kind = CollKind::kAllreduce, .send = send, .recv = recv, .count = count, .dtype = dtype, .op = op},
                options);
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
  // Everyone's (color, key, next free communicator id), gathered here.
  const std::int64_t mine[3] = {color, key, engine_->next_comm_id()};
  std::vector<std::int64_t> all(3 * static_cast<std::size_t>(size()));
  allgather(mine, all.data(), 3, coll::DataType::kInt64, {.caller_waits = true}).wait();
  if (color < 0) return nullptr;
  std::vector<int> ranks;
  std::int64_t id = 0;
  for (int r = 0; r < size(); ++r) {
    const auto* entry = &all[3 * static_cast<std::size_t>(r)];
    if (entry[0] != color) continue;
    ranks.push_back(r);
    id = std::max(id, entry[2]);
  }
  std::stable_sort(ranks.begin(), ranks.end(), [&](int a, int b) {
    return all[3 * static_cast<std::size_t>(a) + 1] < all[3 * static_cast<std::size_t>(b) + 1];
  });
  engine_->reserve_comm_id(static_cast<int>(id));
  std::vector<int> members;
  for (const int r : ranks) members.push_back(members_[static_cast<std::size_t>(r)]);
  return std::shared_ptr<Communicator>(new Communicator(engine_, std::move(members), static_cast<int>(id), timeout_));
}

void Communicator::abort(const std::string& reason) { engine_->abort(state_, reason); }

}  // namespace dlop::sched
