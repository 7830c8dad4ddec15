// Barrier, dissemination: ceil(log2 n) rounds; in round r each rank sends an
// empty message to (me + 2^r) % n and waits for one from (me - 2^r) mod n
// before it starts round r + 1. After round r a rank knows that the 2^(r+1)
// - 1 ranks before it have entered, so after the last round it knows all
// have. Round r uses the tag base_tag + r. All receives are posted at the
// first call, so no message arrives unexpected.
#include <vector>

#include "collectives/registry.hpp"

namespace dlop::coll {
namespace {

class BarrierDissemination final : public Task {
 public:
  BarrierDissemination(const Group& group, transport::Tag base_tag) : group_(group), tag_(base_tag) {
    for (int distance = 1; distance < group.size(); distance <<= 1) ++rounds_;
  }

  bool progress() override {
    const int n = group_.size();
    const int me = group_.rank();
    if (!posted_) {
      posted_ = true;
      for (int r = 0; r < rounds_; ++r) {
        recvs_.push_back(group_.recv((me - (1 << r) + n) % n, nullptr, 0, tag_ + static_cast<transport::Tag>(r)));
      }
    }
    // Send in round r once every earlier round's message has arrived.
    while (round_ < rounds_) {
      if (sent_ == round_) {
        sends_.add(group_.send((me + (1 << round_)) % n, nullptr, 0, tag_ + static_cast<transport::Tag>(round_)));
        ++sent_;
      }
      if (!recvs_[static_cast<std::size_t>(round_)].test()) break;
      ++round_;
    }
    return round_ == rounds_ && sends_.test_all();
  }

 private:
  const Group& group_;
  transport::Tag tag_;
  int rounds_ = 0;
  bool posted_ = false;
  int round_ = 0;  // rounds whose message has arrived
  int sent_ = 0;   // rounds whose message is sent
  std::vector<transport::Request> recvs_;
  RequestSet sends_;
};

}  // namespace

Algorithm barrier_dissemination() {
  return {
      .kind = CollKind::kBarrier,
      .name = "dissemination",
      .accepts = [](const CollArgs&, const Group&) { return true; },
      .create = [](const CollArgs&, const Group& group, transport::Tag base_tag) -> std::unique_ptr<Task> {
        return std::make_unique<BarrierDissemination>(group, base_tag);
      },
  };
}

}  // namespace dlop::coll
