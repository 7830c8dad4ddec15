// Reduce along a binomial tree toward any root, in chunks.
//
// Buffers: every rank reads send[count]; only the root writes recv[count]
// (other ranks' recv is never touched and may be null). send == recv at the
// root is in place. Each rank combines its own chunk with its children's
// (in a fixed order: smallest subtree first, so results do not depend on
// arrival order) and sends the partial result to its parent; the root
// combines straight into recv and finalizes AVG once per element there.
// Scratch is bounded: kWindow chunks in flight, each needing one receive
// buffer per child and (off the root, when there are children) one
// accumulator: kWindow * (children + 1) * kChunkBytes at most. Leaves send
// straight from `send`. Chunk c travels on tag base_tag + c % kWindow: a rank
// finishes chunks in the order its children's data arrives, not in chunk
// order, so chunks in flight together must not share a tag. Chunk c +
// kWindow is sent only after chunk c's send has completed, and UCX matches
// messages of one sender and tag in the order they were sent.
#include <algorithm>
#include <cstring>
#include <deque>
#include <memory>
#include <vector>

#include "binomial_tree.hpp"
#include "collectives/reduce.hpp"
#include "collectives/registry.hpp"

namespace dlop::coll {
namespace {

constexpr std::size_t kChunkBytes = 128u << 10;
constexpr std::size_t kWindow = 4;

class ReduceBinomial final : public Task {
 public:
  ReduceBinomial(const CollArgs& args, const Group& group, transport::Tag base_tag)
      : group_(group),
        tree_(group.size(), args.root, group.rank()),
        op_(args.op),
        dtype_(args.dtype),
        esize_(args.element_size()),
        send_(static_cast<const std::byte*>(args.send)),
        recv_(static_cast<std::byte*>(args.recv)),
        count_(args.count),
        chunk_elems_(std::max<std::size_t>(1, kChunkBytes / esize_)),
        chunks_((count_ + chunk_elems_ - 1) / chunk_elems_),
        tag_(base_tag) {
    check_reduction(op_, dtype_);
    for (const int m : tree_.child_offsets()) children_.push_back(tree_.to_rank(tree_.vrank() + m));
    buffers_per_slot_ = children_.size() + (tree_.is_root() || children_.empty() ? 0 : 1);
    if (buffers_per_slot_ > 0 && chunks_ > 0) {
      const std::size_t slots = std::min(kWindow, chunks_);
      scratch_ = std::make_unique<std::byte[]>(slots * buffers_per_slot_ * chunk_elems_ * esize_);
    }
  }

  bool progress() override {
    while (next_ < chunks_ && inflight_.size() < kWindow) post(next_++);
    for (Slot& slot : inflight_) advance(slot);
    while (!inflight_.empty() && inflight_.front().done) inflight_.pop_front();
    return next_ == chunks_ && inflight_.empty();
  }

 private:
  struct Slot {
    std::size_t chunk = 0;
    std::vector<transport::Request> recvs;  // one per child, in children_ order
    std::size_t reduced = 0;                // children combined so far
    transport::Request send;
    bool sent = false;
    bool done = false;
  };

  std::size_t elems(std::size_t c) const { return std::min(chunk_elems_, count_ - c * chunk_elems_); }
  std::size_t offset(std::size_t c) const { return c * chunk_elems_ * esize_; }
  transport::Tag tag(std::size_t c) const { return tag_ + c % kWindow; }
  // Buffer b of the chunk's slot: child receive buffers, then the accumulator.
  std::byte* buffer(std::size_t c, std::size_t b) const {
    return scratch_.get() + ((c % kWindow) * buffers_per_slot_ + b) * chunk_elems_ * esize_;
  }
  std::byte* accumulator(std::size_t c) const {
    return tree_.is_root() ? recv_ + offset(c) : buffer(c, children_.size());
  }

  void post(std::size_t c) {
    Slot& slot = inflight_.emplace_back();
    slot.chunk = c;
    for (std::size_t i = 0; i < children_.size(); ++i) {
      slot.recvs.push_back(group_.recv(children_[i], buffer(c, i), elems(c) * esize_, tag(c)));
    }
  }

  void advance(Slot& slot) {
    const std::size_t c = slot.chunk;
    while (slot.reduced < children_.size() && slot.recvs[slot.reduced].test()) {
      const std::byte* first = slot.reduced == 0 ? send_ + offset(c) : accumulator(c);
      reduce_into(op_, dtype_, accumulator(c), first, buffer(c, slot.reduced), elems(c));
      ++slot.reduced;
    }
    if (slot.reduced < children_.size() || slot.done) return;
    if (tree_.is_root()) {
      if (children_.empty() && send_ != recv_) std::memcpy(recv_ + offset(c), send_ + offset(c), elems(c) * esize_);
      finalize(op_, dtype_, recv_ + offset(c), elems(c), tree_.size());
      slot.done = true;
      return;
    }
    if (!slot.sent) {
      const std::byte* data = children_.empty() ? send_ + offset(c) : accumulator(c);
      slot.send = group_.send(tree_.parent(), data, elems(c) * esize_, tag(c));
      slot.sent = true;
    }
    slot.done = slot.send.test();
  }

  const Group& group_;
  BinomialTree tree_;
  ReduceOp op_;
  DataType dtype_;
  std::size_t esize_;
  const std::byte* send_;
  std::byte* recv_;
  std::size_t count_;
  std::size_t chunk_elems_;
  std::size_t chunks_;
  transport::Tag tag_;
  std::vector<int> children_;  // group ranks, smallest subtree first
  std::size_t buffers_per_slot_ = 0;
  std::unique_ptr<std::byte[]> scratch_;
  std::size_t next_ = 0;  // next chunk to post
  std::deque<Slot> inflight_;
};

}  // namespace

Algorithm reduce_binomial() {
  return {
      .kind = CollKind::kReduce,
      .name = "binomial",
      .accepts = [](const CollArgs& args, const Group& group) { return args.root >= 0 && args.root < group.size(); },
      // An op the kernels do not define on the dtype is an invalid argument,
      // not a limitation of this algorithm: create() throws naming both.
      .create = [](const CollArgs& args, const Group& group, transport::Tag base_tag) -> std::unique_ptr<Task> {
        return std::make_unique<ReduceBinomial>(args, group, base_tag);
      },
  };
}

}  // namespace dlop::coll
