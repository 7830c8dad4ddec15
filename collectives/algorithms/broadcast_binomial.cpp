// Broadcast along a binomial tree rooted at any rank, pipelined in chunks.
//
// Buffers: broadcast reads and writes `recv` only (in place by nature): the
// root's recv[count] is sent, every other rank's recv[count] is overwritten;
// `send` is ignored. Each rank receives chunk i from its parent and forwards
// it to its children (largest subtree first) as soon as it has arrived, so a
// large message streams down the tree instead of crossing it whole at each
// level. At most kWindow chunks are in flight per link; chunk c travels on tag
// base_tag + c % kWindow (chunk c + kWindow is sent only after chunk c's send
// has completed, and UCX matches messages of one sender and tag in order).
#include <algorithm>
#include <cstddef>
#include <deque>
#include <vector>

#include "binomial_tree.hpp"
#include "collectives/registry.hpp"

namespace dlop::coll {
namespace {

constexpr std::size_t kChunkBytes = 256u << 10;
constexpr std::size_t kWindow = 4;

class BroadcastBinomial final : public Task {
 public:
  BroadcastBinomial(const CollArgs& args, const Group& group, transport::Tag base_tag)
      : group_(group),
        tree_(group.size(), args.root, group.rank()),
        data_(static_cast<std::byte*>(args.recv)),
        bytes_(args.count * args.element_size()),
        chunks_((bytes_ + kChunkBytes - 1) / kChunkBytes),
        tag_(base_tag),
        received_(tree_.is_root() ? chunks_ : 0) {
    const std::vector<int> offsets = tree_.child_offsets();
    for (auto m = offsets.rbegin(); m != offsets.rend(); ++m) children_.push_back(tree_.to_rank(tree_.vrank() + *m));
  }

  bool progress() override {
    // Receive from the parent, up to kWindow chunks ahead of what has arrived.
    while (posted_ < chunks_ && !tree_.is_root() && posted_ - received_ < kWindow) {
      recvs_.push_back(group_.recv(tree_.parent(), chunk(posted_), chunk_bytes(posted_), tag(posted_)));
      ++posted_;
    }
    while (!recvs_.empty() && recvs_.front().test()) {
      recvs_.pop_front();
      ++received_;
    }
    // Forward what has arrived, at most kWindow chunks of sends in flight.
    while (forwarded_ < received_ && forwarded_ - sent_ < kWindow && !children_.empty()) {
      RequestSet& set = sends_.emplace_back();
      for (const int child : children_) {
        set.add(group_.send(child, chunk(forwarded_), chunk_bytes(forwarded_), tag(forwarded_)));
      }
      ++forwarded_;
    }
    while (!sends_.empty() && sends_.front().test_all()) {
      sends_.pop_front();
      ++sent_;
    }
    return received_ == chunks_ && (children_.empty() || sent_ == chunks_);
  }

 private:
  std::byte* chunk(std::size_t c) const { return data_ + c * kChunkBytes; }
  std::size_t chunk_bytes(std::size_t c) const { return std::min(kChunkBytes, bytes_ - c * kChunkBytes); }
  transport::Tag tag(std::size_t c) const { return tag_ + c % kWindow; }

  const Group& group_;
  BinomialTree tree_;
  std::byte* data_;
  std::size_t bytes_;
  std::size_t chunks_;
  transport::Tag tag_;
  std::vector<int> children_;  // group ranks, largest subtree first
  std::size_t posted_ = 0;     // receives posted
  std::size_t received_;       // chunks here (all of them at the root)
  std::size_t forwarded_ = 0;  // chunks whose sends are posted
  std::size_t sent_ = 0;       // chunks whose sends completed
  std::deque<transport::Request> recvs_;
  std::deque<RequestSet> sends_;
};

}  // namespace

Algorithm broadcast_binomial() {
  return {
      .kind = CollKind::kBroadcast,
      .name = "binomial",
      .accepts = [](const CollArgs& args, const Group& group) { return args.root >= 0 && args.root < group.size(); },
      .create = [](const CollArgs& args, const Group& group, transport::Tag base_tag) -> std::unique_ptr<Task> {
        return std::make_unique<BroadcastBinomial>(args, group, base_tag);
      },
  };
}

}  // namespace dlop::coll
