// Scatter along a binomial tree from any root.
//
// Buffers and in place: as scatter "linear" (the root reads rank r's block at
// send + r * count; every rank receives recv[count]; at the root, recv == send
// or recv == send + root * count means its block stays where it is).
// The root sends each child the blocks of the child's whole subtree, straight
// from `send` (as two messages when the subtree's ranks wrap past rank n - 1,
// the part from rank 0 on tag base_tag + 1). A rank with children receives
// its subtree's blocks into a scratch buffer (subtree size * count elements),
// keeps its own and forwards the rest, largest subtree first; a leaf
// receives straight into recv. For small blocks, as gather "binomial".
#include <cstring>
#include <memory>
#include <vector>

#include "binomial_tree.hpp"
#include "collectives/registry.hpp"

namespace dlop::coll {
namespace {

class ScatterBinomial final : public Task {
 public:
  ScatterBinomial(const CollArgs& args, const Group& group, transport::Tag base_tag)
      : group_(group),
        tree_(group.size(), args.root, group.rank()),
        send_(static_cast<const std::byte*>(args.send)),
        recv_(static_cast<std::byte*>(args.recv)),
        block_(args.count * args.element_size()),
        tag_(base_tag) {}

  bool progress() override {
    if (stage_ == Stage::kPost) {
      if (block_ == 0) {
        stage_ = Stage::kDone;
      } else if (tree_.is_root()) {
        send_from_root();
        stage_ = Stage::kSend;
      } else {
        post_receive();
        stage_ = Stage::kReceive;
      }
    }
    if (stage_ == Stage::kReceive && recvs_.test_all()) {
      if (scratch_) forward();
      stage_ = Stage::kSend;
    }
    if (stage_ == Stage::kSend && sends_.test_all()) stage_ = Stage::kDone;
    return stage_ == Stage::kDone;
  }

 private:
  enum class Stage { kPost, kReceive, kSend, kDone };

  std::size_t at(int blocks) const { return static_cast<std::size_t>(blocks) * block_; }

  void send_from_root() {
    const std::vector<int> offsets = tree_.child_offsets();
    for (auto it = offsets.rbegin(); it != offsets.rend(); ++it) {  // largest subtree first: the longest way to go
      const int m = *it;
      const BinomialTree::Runs runs = tree_.runs(m, tree_.subtree_size(m));
      const int child = tree_.to_rank(m);
      sends_.add(group_.send(child, send_ + at(runs.first_rank), at(runs.first_len), tag_));
      if (runs.second_len > 0) sends_.add(group_.send(child, send_, at(runs.second_len), tag_ + 1));
    }
    const std::byte* mine = send_ + at(tree_.to_rank(0));
    if (recv_ != send_ && recv_ != mine) std::memcpy(recv_, mine, block_);
  }

  void post_receive() {
    const int size = tree_.subtree_size(tree_.vrank());
    if (size == 1) {
      recvs_.add(group_.recv(tree_.parent(), recv_, block_, tag_));
      return;
    }
    scratch_ = std::make_unique<std::byte[]>(at(size));
    if (!tree_.parent_is_root()) {
      recvs_.add(group_.recv(tree_.parent(), scratch_.get(), at(size), tag_));
      return;
    }
    const BinomialTree::Runs runs = tree_.runs(tree_.vrank(), size);  // the root sends from `send`
    recvs_.add(group_.recv(tree_.parent(), scratch_.get(), at(runs.first_len), tag_));
    if (runs.second_len > 0) {
      recvs_.add(group_.recv(tree_.parent(), scratch_.get() + at(runs.first_len), at(runs.second_len), tag_ + 1));
    }
  }

  void forward() {
    std::memcpy(recv_, scratch_.get(), block_);
    const std::vector<int> offsets = tree_.child_offsets();
    for (auto it = offsets.rbegin(); it != offsets.rend(); ++it) {
      const int child = tree_.vrank() + *it;
      sends_.add(group_.send(tree_.to_rank(child), scratch_.get() + at(*it), at(tree_.subtree_size(child)), tag_));
    }
  }

  const Group& group_;
  BinomialTree tree_;
  const std::byte* send_;
  std::byte* recv_;
  std::size_t block_;
  transport::Tag tag_;
  Stage stage_ = Stage::kPost;
  std::unique_ptr<std::byte[]> scratch_;
  RequestSet recvs_;
  RequestSet sends_;
};

}  // namespace

Algorithm scatter_binomial() {
  return {
      .kind = CollKind::kScatter,
      .name = "binomial",
      .accepts = [](const CollArgs& args, const Group& group) { return args.root >= 0 && args.root < group.size(); },
      .create = [](const CollArgs& args, const Group& group, transport::Tag base_tag) -> std::unique_ptr<Task> {
        return std::make_unique<ScatterBinomial>(args, group, base_tag);
      },
  };
}

}  // namespace dlop::coll
