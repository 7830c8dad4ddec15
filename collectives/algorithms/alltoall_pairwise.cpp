// All-to-all and all-to-all-v, pairwise exchange.
//
// Step k (1 <= k < n) sends this rank's block for (me + k) % n and receives
// the block from (me - k + n) % n; this rank's own block is copied locally.
// At most kWindow steps are in flight, so memory and matching queues stay
// bounded however many ranks there are; steps retire in order. Each ordered
// pair of ranks exchanges at most one message per operation, so every
// message uses the tag base_tag. Empty blocks (zero counts in alltoallv)
// send and receive nothing: both sides know the size.
//
// Buffers (coll_args.hpp): alltoall send[count * n] -> recv[count * n], block
// r at r * count; alltoallv send blocks of send_counts[r] and recv blocks of
// counts[r], each packed in rank order. In place (send == recv): the send
// side is first copied to a scratch buffer (the whole send side: in-place
// all-to-all trades memory for convenience).
#include <algorithm>
#include <cstring>
#include <deque>
#include <memory>
#include <numeric>
#include <vector>

#include "collectives/registry.hpp"

namespace dlop::coll {
namespace {

constexpr int kWindow = 4;

// Byte offsets and lengths of the n blocks of one side.
struct Blocks {
  std::vector<std::size_t> offset, bytes;
  Blocks(const std::vector<std::size_t>& counts, std::size_t element_size) {
    std::size_t at = 0;
    for (const std::size_t c : counts) {
      offset.push_back(at);
      bytes.push_back(c * element_size);
      at += c * element_size;
    }
  }
  std::size_t total() const { return bytes.empty() ? 0 : offset.back() + bytes.back(); }
};

class AlltoallPairwise final : public Task {
 public:
  AlltoallPairwise(const CollArgs& args, const Group& group, transport::Tag base_tag)
      : group_(group),
        send_(static_cast<const std::byte*>(args.send)),
        recv_(static_cast<std::byte*>(args.recv)),
        sends_(side_counts(args, group, true), args.element_size()),
        recvs_(side_counts(args, group, false), args.element_size()),
        tag_(base_tag) {}

  bool progress() override {
    const int n = group_.size();
    const int me = group_.rank();
    if (next_ == 0) {
      next_ = 1;
      if (send_ == recv_ && n > 1 && sends_.total() > 0) {
        scratch_ = std::make_unique<std::byte[]>(sends_.total());
        std::memcpy(scratch_.get(), send_, sends_.total());
        send_ = scratch_.get();
      }
      const auto own = static_cast<std::size_t>(me);
      if (recvs_.bytes[own] > 0 && send_ + sends_.offset[own] != recv_ + recvs_.offset[own]) {
        std::memcpy(recv_ + recvs_.offset[own], send_ + sends_.offset[own], recvs_.bytes[own]);
      }
    }
    while (next_ < n && static_cast<int>(steps_.size()) < kWindow) post_step(next_++);
    while (!steps_.empty() && steps_.front().test_all()) steps_.pop_front();
    return next_ == n && steps_.empty();
  }

 private:
  static std::vector<std::size_t> side_counts(const CollArgs& args, const Group& group, bool send_side) {
    if (args.kind == CollKind::kAlltoallv) return send_side ? args.send_counts : args.counts;
    return std::vector<std::size_t>(static_cast<std::size_t>(group.size()), args.count);
  }

  void post_step(int k) {
    const int n = group_.size();
    const auto to = static_cast<std::size_t>((group_.rank() + k) % n);
    const auto from = static_cast<std::size_t>((group_.rank() - k + n) % n);
    RequestSet& step = steps_.emplace_back();
    if (recvs_.bytes[from] > 0) {
      step.add(group_.recv(static_cast<int>(from), recv_ + recvs_.offset[from], recvs_.bytes[from], tag_));
    }
    if (sends_.bytes[to] > 0) {
      step.add(group_.send(static_cast<int>(to), send_ + sends_.offset[to], sends_.bytes[to], tag_));
    }
  }

  const Group& group_;
  const std::byte* send_;
  std::byte* recv_;
  Blocks sends_;
  Blocks recvs_;
  transport::Tag tag_;
  std::unique_ptr<std::byte[]> scratch_;  // the send side, when in place
  int next_ = 0;                          // next step to post; 0: nothing posted yet
  std::deque<RequestSet> steps_;
};

bool accepts_alltoallv(const CollArgs& args, const Group& group) {
  const auto n = static_cast<std::size_t>(group.size());
  if (args.counts.size() != n || args.send_counts.size() != n) return false;
  // This rank's block to itself must have the same size on both sides.
  const auto me = static_cast<std::size_t>(group.rank());
  return args.counts[me] == args.send_counts[me];
}

std::unique_ptr<Task> create(const CollArgs& args, const Group& group, transport::Tag base_tag) {
  return std::make_unique<AlltoallPairwise>(args, group, base_tag);
}

}  // namespace

Algorithm alltoall_pairwise() {
  return {
      .kind = CollKind::kAlltoall,
      .name = "pairwise",
      .accepts = [](const CollArgs&, const Group&) { return true; },
      .create = create,
  };
}

Algorithm alltoallv_pairwise() {
  return {
      .kind = CollKind::kAlltoallv,
      .name = "pairwise",
      .accepts = accepts_alltoallv,
      .create = create,
  };
}

}  // namespace dlop::coll
