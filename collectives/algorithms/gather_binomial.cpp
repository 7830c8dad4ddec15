// Gather along a binomial tree toward any root.
//
// Buffers and in place: as gather "linear" (every rank sends send[count]; the
// root receives rank r's block at recv + r * count; at the root, send == recv
// or send == recv + root * count means its block is already in place).
// A rank with children collects its subtree's blocks, in vrank order, in a
// scratch buffer (subtree size * count elements; a leaf sends straight from
// `send`) and sends them to its parent in one message. The root receives each
// child's subtree straight into recv: a subtree whose ranks wrap past rank
// n - 1 arrives as two messages, the part from rank 0 on tag base_tag + 1.
// log2(n) steps instead of n - 1 receives at the root, for the price of
// copies through intermediate ranks: for small blocks.
#include <cstring>
#include <memory>

#include "binomial_tree.hpp"
#include "collectives/registry.hpp"

namespace dlop::coll {
namespace {

class GatherBinomial final : public Task {
 public:
  GatherBinomial(const CollArgs& args, const Group& group, transport::Tag base_tag)
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
      } else {
        if (tree_.is_root()) {
          post_root();
        } else {
          post_subtree();
        }
        stage_ = Stage::kGather;
      }
    }
    if (stage_ == Stage::kGather && recvs_.test_all()) {
      if (!tree_.is_root()) send_subtree();
      stage_ = Stage::kSend;
    }
    if (stage_ == Stage::kSend && sends_.test_all()) stage_ = Stage::kDone;
    return stage_ == Stage::kDone;
  }

 private:
  enum class Stage { kPost, kGather, kSend, kDone };

  std::size_t at(int blocks) const { return static_cast<std::size_t>(blocks) * block_; }

  void post_root() {
    for (const int m : tree_.child_offsets()) {
      const BinomialTree::Runs runs = tree_.runs(m, tree_.subtree_size(m));
      const int child = tree_.to_rank(m);
      recvs_.add(group_.recv(child, recv_ + at(runs.first_rank), at(runs.first_len), tag_));
      if (runs.second_len > 0) recvs_.add(group_.recv(child, recv_, at(runs.second_len), tag_ + 1));
    }
    std::byte* mine = recv_ + at(tree_.to_rank(0));
    if (send_ != recv_ && send_ != mine) std::memcpy(mine, send_, block_);
  }

  void post_subtree() {
    const int size = tree_.subtree_size(tree_.vrank());
    if (size == 1) return;  // a leaf sends straight from `send`
    scratch_ = std::make_unique<std::byte[]>(at(size));
    std::memcpy(scratch_.get(), send_, block_);
    for (const int m : tree_.child_offsets()) {
      const int child = tree_.vrank() + m;
      recvs_.add(group_.recv(tree_.to_rank(child), scratch_.get() + at(m), at(tree_.subtree_size(child)), tag_));
    }
  }

  void send_subtree() {
    const int size = tree_.subtree_size(tree_.vrank());
    const std::byte* data = scratch_ ? scratch_.get() : send_;
    if (!tree_.parent_is_root()) {
      sends_.add(group_.send(tree_.parent(), data, at(size), tag_));
      return;
    }
    const BinomialTree::Runs runs = tree_.runs(tree_.vrank(), size);  // the root receives in place
    sends_.add(group_.send(tree_.parent(), data, at(runs.first_len), tag_));
    if (runs.second_len > 0) {
      sends_.add(group_.send(tree_.parent(), data + at(runs.first_len), at(runs.second_len), tag_ + 1));
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

Algorithm gather_binomial() {
  return {
      .kind = CollKind::kGather,
      .name = "binomial",
      .accepts = [](const CollArgs& args, const Group& group) { return args.root >= 0 && args.root < group.size(); },
      .create = [](const CollArgs& args, const Group& group, transport::Tag base_tag) -> std::unique_ptr<Task> {
        return std::make_unique<GatherBinomial>(args, group, base_tag);
      },
  };
}

}  // namespace dlop::coll
