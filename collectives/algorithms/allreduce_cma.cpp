// All-reduce among ranks of one host by single-copy access to the peers'
// buffers (Linux cross-memory attach): each rank reduces its own block,
// reading every peer's input block once into a cache-sized scratch buffer
// (process_vm_readv), and writes each reduced chunk, while it is still in
// cache, straight into every peer's output (process_vm_writev). Per rank
// that is about 2 S bytes of traffic to memory for S bytes, against 2.5 S
// when peers read the reduced blocks back later and 3.5 S or more for copies
// through a shared segment.
//
// In place, writing into a peer's buffer is safe: the region of block b in
// peer p's buffer is p's input only for b's owner, which reads each chunk of
// it before it writes that chunk back reduced.
//
// Steps (tags base+0..1): exchange buffer addresses; reduce own block chunk
// by chunk, pushing each chunk to every peer; tell everyone, and wait until
// everyone said so (no rank returns while a peer still writes into it).
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>
#include <fmt/format.h>

#include "blocks.hpp"
#include "collectives/reduce.hpp"
#include "collectives/registry.hpp"
#include "core/error.hpp"

namespace dlop::coll {
namespace {

constexpr std::size_t kChunkBytes = 256u << 10;  // fits in L2 with room to spare

struct Exposed {  // what a rank tells its peers
  std::int64_t pid;
  std::uint64_t send;
  std::uint64_t recv;
};

// Whether this process may read another's memory (seccomp may forbid it).
bool cma_permitted() {
  static const bool permitted = [] {
    char source = 1, target = 0;
    iovec local{&target, 1}, remote{&source, 1};
    return ::process_vm_readv(::getpid(), &local, 1, &remote, 1, 0) == 1;
  }();
  return permitted;
}

// A failed access usually means the peer is gone (ESRCH) or going (EFAULT
// while its memory is torn down), often because a third rank died and the
// peer gave up on the collective: name the dead rank if there is one.
[[noreturn]] void access_failed(const Group& group, const char* what, int peer, std::int64_t pid, std::size_t bytes,
                                ssize_t got, int err) {
  // A peer that saw the death first may already have left and freed its
  // buffer (EFAULT) while the dying process is still being torn down: give
  // the liveness check a moment to name the rank that really died.
  const auto give_up = std::chrono::steady_clock::now() + 2 * group.mesh().options().watchdog + std::chrono::milliseconds(100);
  do {
    group.mesh().check_peers();
    for (int r = 0; r < group.size(); ++r) {
      if (const auto& failure = group.mesh().peer_failure(group.mesh_rank(r))) {
        throw_error(Errc::kPeerDead, fmt::format("cma all-reduce: {} died ({})",
                                                 group.mesh().describe(group.mesh_rank(r)), *failure));
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  } while (std::chrono::steady_clock::now() < give_up);
  throw_error(err == ESRCH || err == EFAULT ? Errc::kPeerDead : Errc::kTransport,
              fmt::format("cma all-reduce: {} {} B of rank {} (pid {}) failed: {}{}", what, bytes, peer, pid,
                          got < 0 ? std::strerror(err) : "short transfer",
                          err == EFAULT ? " (it left the collective: it failed or exited)" : ""));
}

void read_peer(const Group& group, int peer, std::int64_t pid, void* into, std::uint64_t from, std::size_t bytes) {
  iovec local{into, bytes};
  iovec remote{reinterpret_cast<void*>(from), bytes};
  const ssize_t got = ::process_vm_readv(static_cast<pid_t>(pid), &local, 1, &remote, 1, 0);
  if (got != static_cast<ssize_t>(bytes)) access_failed(group, "reading", peer, pid, bytes, got, errno);
}

void write_peer(const Group& group, int peer, std::int64_t pid, std::uint64_t into, const void* from, std::size_t bytes) {
  iovec local{const_cast<void*>(from), bytes};
  iovec remote{reinterpret_cast<void*>(into), bytes};
  const ssize_t got = ::process_vm_writev(static_cast<pid_t>(pid), &local, 1, &remote, 1, 0);
  if (got != static_cast<ssize_t>(bytes)) access_failed(group, "writing", peer, pid, bytes, got, errno);
}

class CmaAllreduce : public Task {
 public:
  CmaAllreduce(const CollArgs& args, const Group& group, transport::Tag tag)
      : args_(args), group_(group), tag_(tag), n_(group.size()), me_(group.rank()),
        size_(dtype_size(args.dtype)), exposed_(static_cast<std::size_t>(n_)), scratch_(kChunkBytes) {
    mine_ = {::getpid(), reinterpret_cast<std::uintptr_t>(args.send), reinterpret_cast<std::uintptr_t>(args.recv)};
    for (int r = 0; r < n_; ++r) {
      if (r == me_) continue;
      requests_.add(group.recv(r, &exposed_[static_cast<std::size_t>(r)], sizeof(Exposed), tag_));
      requests_.add(group.send(r, &mine_, sizeof(Exposed), tag_));
    }
    exposed_[static_cast<std::size_t>(me_)] = mine_;
  }

  bool progress() override {
    if (!requests_.test_all()) return false;
    if (phase_ == Phase::kReduce) {
      if (!reduce_some()) return false;
      notify_all(1);
      phase_ = Phase::kDone;
      return requests_.test_all();
    }
    return true;
  }

  bool has_local_work() const override {
    return phase_ == Phase::kReduce && requests_.empty() && done_bytes_ < block_count(me_) * size_;
  }

 private:
  enum class Phase { kReduce, kDone };

  static std::byte* byte_ptr(void* p) { return static_cast<std::byte*>(p); }
  std::size_t block_count(int r) const {
    const auto parts = static_cast<std::size_t>(n_), i = static_cast<std::size_t>(r);
    return even_block_offset(args_.count, parts, i + 1) - even_block_offset(args_.count, parts, i);
  }
  std::size_t block_offset(int r) const {
    return even_block_offset(args_.count, static_cast<std::size_t>(n_), static_cast<std::size_t>(r)) * size_;
  }

  void notify_all(transport::Tag step) {
    for (int r = 0; r < n_; ++r) {
      if (r == me_) continue;
      requests_.add(group_.recv(r, nullptr, 0, tag_ + step));
      requests_.add(group_.send(r, nullptr, 0, tag_ + step));
    }
  }

  // Reduces one chunk of this rank's block from every peer and writes it into
  // every peer's output; true when the block is done.
  bool reduce_some() {
    const std::size_t block_bytes = block_count(me_) * size_;
    if (done_bytes_ >= block_bytes) return true;
    const std::size_t chunk = std::min(kChunkBytes / size_ * size_, block_bytes - done_bytes_);
    const std::size_t offset = block_offset(me_) + done_bytes_;
    std::byte* out = byte_ptr(args_.recv) + offset;
    const auto* own = static_cast<const std::byte*>(args_.send) + offset;
    bool first = true;
    for (int r = 0; r < n_; ++r) {
      if (r == me_) continue;
      const Exposed& peer = exposed_[static_cast<std::size_t>(r)];
      read_peer(group_, r, peer.pid, scratch_.data(), peer.send + offset, chunk);
      if (first) reduce_into(args_.op, args_.dtype, out, own, scratch_.data(), chunk / size_);
      else reduce_inplace(args_.op, args_.dtype, out, scratch_.data(), chunk / size_);
      first = false;
    }
    finalize(args_.op, args_.dtype, out, chunk / size_, n_);
    for (int r = 0; r < n_; ++r) {
      if (r == me_) continue;
      const Exposed& peer = exposed_[static_cast<std::size_t>(r)];
      write_peer(group_, r, peer.pid, peer.recv + offset, out, chunk);
    }
    done_bytes_ += chunk;
    return done_bytes_ >= block_bytes;
  }

  CollArgs args_;
  const Group& group_;
  transport::Tag tag_;
  int n_;
  int me_;
  std::size_t size_;
  Exposed mine_{};
  std::vector<Exposed> exposed_;
  std::vector<std::byte> scratch_;
  RequestSet requests_;
  Phase phase_ = Phase::kReduce;
  std::size_t done_bytes_ = 0;
};

}  // namespace

void register_cma_allreduce(std::vector<Algorithm>& out) {
  out.push_back({CollKind::kAllreduce, "cma",
                 [](const CollArgs& args, const Group& group) {
                   return group.size() >= 2 && group.hosts() == 1 && args.count > 0 && cma_permitted();
                 },
                 [](const CollArgs& args, const Group& group, transport::Tag tag) -> std::unique_ptr<Task> {
                   return std::make_unique<CmaAllreduce>(args, group, tag);
                 }});
}

}  // namespace dlop::coll
