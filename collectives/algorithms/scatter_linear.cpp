// Scatter, linear: the root posts one send per rank, every other rank receives.
//
// Buffers: the root reads rank r's block at send + r * count (other ranks'
// send is never read and may be null); every rank receives recv[count].
// In place, at the root only: recv == send (MPI_IN_PLACE) or recv == the
// root's own block (send + root * count) both mean "the root's block stays
// where it is", and the root copies nothing. Tag: base_tag.
#include <cstring>

#include "collectives/registry.hpp"

namespace dlop::coll {
namespace {

class ScatterLinear final : public Task {
 public:
  ScatterLinear(const CollArgs& args, const Group& group, transport::Tag base_tag)
      : group_(group),
        root_(args.root),
        send_(static_cast<const std::byte*>(args.send)),
        recv_(args.recv),
        block_(args.count * args.element_size()),
        tag_(base_tag) {}

  bool progress() override {
    if (!posted_) {
      posted_ = true;
      if (block_ == 0) return true;
      if (group_.rank() != root_) {
        requests_.add(group_.recv(root_, recv_, block_, tag_));
      } else {
        for (int r = 0; r < group_.size(); ++r) {
          if (r != root_) requests_.add(group_.send(r, send_ + static_cast<std::size_t>(r) * block_, block_, tag_));
        }
        const std::byte* mine = send_ + static_cast<std::size_t>(root_) * block_;
        if (recv_ != send_ && recv_ != mine) std::memcpy(recv_, mine, block_);
      }
    }
    return requests_.test_all();
  }

 private:
  const Group& group_;
  int root_;
  const std::byte* send_;
  void* recv_;
  std::size_t block_;
  transport::Tag tag_;
  bool posted_ = false;
  RequestSet requests_;
};

}  // namespace

Algorithm scatter_linear() {
  return {
      .kind = CollKind::kScatter,
      .name = "linear",
      .accepts = [](const CollArgs& args, const Group& group) { return args.root >= 0 && args.root < group.size(); },
      .create = [](const CollArgs& args, const Group& group, transport::Tag base_tag) -> std::unique_ptr<Task> {
        return std::make_unique<ScatterLinear>(args, group, base_tag);
      },
  };
}

}  // namespace dlop::coll
