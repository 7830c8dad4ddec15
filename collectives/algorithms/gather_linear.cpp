// Gather, linear: the root posts one receive per rank, every other rank sends.
//
// Buffers: every rank sends send[count]; the root receives rank r's block at
// recv + r * count (other ranks' recv is never touched and may be null).
// In place, at the root only: send == recv (MPI_IN_PLACE) or send == the
// root's own block (recv + root * count) both mean "the root's block is
// already where it belongs", and the root copies nothing. Tag: base_tag.
#include <cstring>

#include "collectives/registry.hpp"

namespace dlop::coll {
namespace {

class GatherLinear final : public Task {
 public:
  GatherLinear(const CollArgs& args, const Group& group, transport::Tag base_tag)
      : group_(group),
        root_(args.root),
        send_(args.send),
        recv_(static_cast<std::byte*>(args.recv)),
        block_(args.count * args.element_size()),
        tag_(base_tag) {}

  bool progress() override {
    if (!posted_) {
      posted_ = true;
      if (block_ == 0) return true;
      if (group_.rank() != root_) {
        requests_.add(group_.send(root_, send_, block_, tag_));
      } else {
        for (int r = 0; r < group_.size(); ++r) {
          if (r != root_) requests_.add(group_.recv(r, recv_ + static_cast<std::size_t>(r) * block_, block_, tag_));
        }
        std::byte* mine = recv_ + static_cast<std::size_t>(root_) * block_;
        if (send_ != recv_ && send_ != mine) std::memcpy(mine, send_, block_);
      }
    }
    return requests_.test_all();
  }

 private:
  const Group& group_;
  int root_;
  const void* send_;
  std::byte* recv_;
  std::size_t block_;
  transport::Tag tag_;
  bool posted_ = false;
  RequestSet requests_;
};

}  // namespace

Algorithm gather_linear() {
  return {
      .kind = CollKind::kGather,
      .name = "linear",
      .accepts = [](const CollArgs& args, const Group& group) { return args.root >= 0 && args.root < group.size(); },
      .create = [](const CollArgs& args, const Group& group, transport::Tag base_tag) -> std::unique_ptr<Task> {
        return std::make_unique<GatherLinear>(args, group, base_tag);
      },
  };
}

}  // namespace dlop::coll
