#include "rooted_blocks.hpp"

#include <cstring>
#include <vector>

#include "binomial_tree.hpp"

namespace dlop::coll {
namespace {

// The buffers of both algorithms and the one way they move a block range.
class BlocksTask : public Task {
 protected:
  BlocksTask(const CollArgs& args, const Group& group, transport::Tag base_tag, BlockFlow flow)
      : group_(group),
        root_(args.root),
        send_(static_cast<const std::byte*>(args.send)),
        recv_(static_cast<std::byte*>(args.recv)),
        block_(args.count * args.element_size()),
        tag_(base_tag),
        to_root_(flow == BlockFlow::kToRoot) {}

  std::size_t at(int blocks) const { return static_cast<std::size_t>(blocks) * block_; }

  // Sends `bytes` from `offset` of send (or of the scratch, once there is
  // one), or receives them to `offset` of recv (or of the scratch).
  void transfer(RequestSet& set, bool sending, int peer, std::size_t offset, std::size_t bytes,
                transport::Tag tag) const {
    if (sending) {
      set.add(group_.send(peer, (scratch_ ? scratch_.get() : send_) + offset, bytes, tag));
    } else {
      set.add(group_.recv(peer, (scratch_ ? scratch_.get() : recv_) + offset, bytes, tag));
    }
  }

  // At the root, its own block between the block array and its own buffer,
  // unless that buffer is the array itself (MPI_IN_PLACE) or the root's slot
  // in it: then the block is where it belongs already.
  void place_root_block() const {
    if (to_root_) {
      std::byte* slot = recv_ + at(root_);
      if (send_ != recv_ && send_ != slot) std::memcpy(slot, send_, block_);
    } else {
      const std::byte* slot = send_ + at(root_);
      if (recv_ != send_ && recv_ != slot) std::memcpy(recv_, slot, block_);
    }
  }

  const Group& group_;
  int root_;
  const std::byte* send_;
  std::byte* recv_;
  std::size_t block_;  // bytes
  transport::Tag tag_;
  bool to_root_;
  std::unique_ptr<std::byte[]> scratch_;  // a subtree's blocks (binomial, inner ranks)
};

class LinearBlocks final : public BlocksTask {
 public:
  LinearBlocks(const CollArgs& args, const Group& group, transport::Tag base_tag, BlockFlow flow)
      : BlocksTask(args, group, base_tag, flow) {}

  bool progress() override {
    if (!posted_) {
      posted_ = true;
      if (block_ == 0) return true;
      if (group_.rank() != root_) {
        transfer(requests_, to_root_, root_, 0, block_, tag_);
      } else {
        for (int r = 0; r < group_.size(); ++r) {
          if (r != root_) transfer(requests_, !to_root_, r, at(r), block_, tag_);
        }
        place_root_block();
      }
    }
    return requests_.test_all();
  }

 private:
  bool posted_ = false;
  RequestSet requests_;
};

// Inbound transfers first, then outbound ones: toward the root, a rank
// collects its children's subtrees and then sends its own subtree to its
// parent; from the root, the other way round. A leaf's subtree is its own
// block, sent straight from send or received straight into recv; an inner
// rank holds its subtree's blocks, in vrank order, in scratch.
class BinomialBlocks final : public BlocksTask {
 public:
  BinomialBlocks(const CollArgs& args, const Group& group, transport::Tag base_tag, BlockFlow flow)
      : BlocksTask(args, group, base_tag, flow), tree_(group.size(), args.root, group.rank()) {}

  bool progress() override {
    if (stage_ == Stage::kPost) {
      if (block_ == 0) {
        stage_ = Stage::kDone;
      } else {
        prepare();
        post_links(inbound_, false);
        stage_ = Stage::kInbound;
      }
    }
    if (stage_ == Stage::kInbound && inbound_.test_all()) {
      if (!to_root_ && scratch_) std::memcpy(recv_, scratch_.get(), block_);  // keep this rank's block
      post_links(outbound_, true);
      stage_ = Stage::kOutbound;
    }
    if (stage_ == Stage::kOutbound && outbound_.test_all()) stage_ = Stage::kDone;
    return stage_ == Stage::kDone;
  }

 private:
  enum class Stage { kPost, kInbound, kOutbound, kDone };

  void prepare() {
    const int size = tree_.subtree_size(tree_.vrank());
    if (tree_.is_root()) {
      place_root_block();
    } else if (size > 1) {
      scratch_ = std::make_unique<std::byte[]>(at(size));
      if (to_root_) std::memcpy(scratch_.get(), send_, block_);
    }
  }

  // Children receive toward the root and send from it; the parent the reverse.
  void post_links(RequestSet& set, bool sending) {
    if (sending != to_root_) {
      children(set, sending);
    } else if (!tree_.is_root()) {
      parent(set, sending);
    }
  }

  void children(RequestSet& set, bool sending) const {
    const std::vector<int> offsets = tree_.child_offsets();
    for (auto m = offsets.rbegin(); m != offsets.rend(); ++m) {  // largest subtree first: the longest way to go
      const int child = tree_.vrank() + *m;
      if (!tree_.is_root()) {
        transfer(set, sending, tree_.to_rank(child), at(*m), at(tree_.subtree_size(child)), tag_);
        continue;
      }
      // The root's array is in rank order: a subtree whose ranks wrap past
      // rank n - 1 is two runs there, the one from rank 0 on tag + 1.
      const BinomialTree::Runs runs = tree_.runs(child, tree_.subtree_size(child));
      transfer(set, sending, tree_.to_rank(child), at(runs.first_rank), at(runs.first_len), tag_);
      if (runs.second_len > 0) transfer(set, sending, tree_.to_rank(child), 0, at(runs.second_len), tag_ + 1);
    }
  }

  void parent(RequestSet& set, bool sending) const {
    const int size = tree_.subtree_size(tree_.vrank());
    if (!tree_.parent_is_root()) {
      transfer(set, sending, tree_.parent(), 0, at(size), tag_);
      return;
    }
    const BinomialTree::Runs runs = tree_.runs(tree_.vrank(), size);  // cut as the root cuts it
    transfer(set, sending, tree_.parent(), 0, at(runs.first_len), tag_);
    if (runs.second_len > 0) {
      transfer(set, sending, tree_.parent(), at(runs.first_len), at(runs.second_len), tag_ + 1);
    }
  }

  BinomialTree tree_;
  Stage stage_ = Stage::kPost;
  RequestSet inbound_;
  RequestSet outbound_;
};

}  // namespace

std::unique_ptr<Task> make_linear_blocks_task(const CollArgs& args, const Group& group, transport::Tag base_tag,
                                              BlockFlow flow) {
  return std::make_unique<LinearBlocks>(args, group, base_tag, flow);
}

std::unique_ptr<Task> make_binomial_blocks_task(const CollArgs& args, const Group& group, transport::Tag base_tag,
                                                BlockFlow flow) {
  return std::make_unique<BinomialBlocks>(args, group, base_tag, flow);
}

}  // namespace dlop::coll
