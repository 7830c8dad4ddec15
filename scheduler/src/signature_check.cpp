#include "signature_check.hpp"

#include <fmt/format.h>

#include <cstring>
#include <numeric>

#include "core/error.hpp"

namespace dlop::sched {
namespace {

struct Signature {
  std::uint64_t seq;
  std::uint64_t count;  // total elements (sum of counts for v-variants)
  std::int32_t root;
  std::uint8_t kind;
  std::uint8_t dtype;
  std::uint8_t op;
  std::uint8_t pad = 0;

  static Signature of(const coll::CollArgs& args, std::uint64_t seq) {
    const bool v = args.kind == coll::CollKind::kAllgatherv || args.kind == coll::CollKind::kReduceScatterv ||
                   args.kind == coll::CollKind::kAlltoallv;
    const std::uint64_t count = v ? std::accumulate(args.counts.begin(), args.counts.end(), std::uint64_t{0}) : args.count;
    return {seq, count, args.root, static_cast<std::uint8_t>(args.kind), static_cast<std::uint8_t>(args.dtype),
            static_cast<std::uint8_t>(args.op)};
  }
  bool operator==(const Signature&) const = default;
  std::string describe() const {
    return fmt::format("#{} {} of {} x {} ({}, root {})", seq, coll::kind_name(static_cast<coll::CollKind>(kind)), count,
                       coll::dtype_name(static_cast<coll::DataType>(dtype)),
                       coll::op_name(static_cast<coll::ReduceOp>(op)), root);
  }
};

class SignatureChecked : public coll::Task {
 public:
  SignatureChecked(const coll::CollArgs& args, CommState& comm, transport::Tag base_tag, std::uint64_t seq,
                   const coll::Algorithm& algorithm)
      : args_(args), comm_(comm), group_(*comm.group), tag_(base_tag), algorithm_(algorithm),
        mine_(Signature::of(args, seq)), theirs_(static_cast<std::size_t>(group_.size())) {
    for (int r = 0; r < group_.size(); ++r) {
      if (r == group_.rank()) continue;
      exchange_.add(group_.recv(r, &theirs_[static_cast<std::size_t>(r)], sizeof(Signature), tag_ | coll::kMaxStep));
      exchange_.add(group_.send(r, &mine_, sizeof(Signature), tag_ | coll::kMaxStep));
    }
  }

  bool progress() override {
    if (!task_) {
      if (!exchange_.test_all()) return false;
      // Tasks are made in sequence order, as without the check: algorithms
      // that order their operations among themselves at creation (the shm
      // all-reduce) must see the same order on every rank.
      if (comm_.signature_tasks_made != mine_.seq) {
        if (!comm_.broken.empty()) {
          throw_error(Errc::kCanceled, "the communicator failed before this operation's turn: " + comm_.broken);
        }
        return false;
      }
      for (int r = 0; r < group_.size(); ++r) {
        if (r != group_.rank() && !(theirs_[static_cast<std::size_t>(r)] == mine_)) {
          throw_error(Errc::kInvalidArgument,
                      fmt::format("mismatched collectives: rank {} submitted {} but rank {} submitted {}", group_.rank(),
                                  mine_.describe(), r, theirs_[static_cast<std::size_t>(r)].describe()));
        }
      }
      ++comm_.signature_tasks_made;  // a failing create() breaks the communicator: no one waits on it
      task_ = algorithm_.create(args_, group_, tag_);
    }
    return task_->progress();
  }
  std::vector<int> waiting_for() const override { return task_ ? task_->waiting_for() : std::vector<int>{}; }
  bool polls_memory() const override { return task_ && task_->polls_memory(); }
  bool has_local_work() const override { return task_ && task_->has_local_work(); }

 private:
  coll::CollArgs args_;
  CommState& comm_;
  const coll::Group& group_;
  transport::Tag tag_;
  const coll::Algorithm& algorithm_;
  Signature mine_;
  std::vector<Signature> theirs_;
  coll::RequestSet exchange_;
  std::unique_ptr<coll::Task> task_;
};

}  // namespace

std::unique_ptr<coll::Task> make_signature_checked(const coll::CollArgs& args, CommState& comm, transport::Tag base_tag,
                                                   std::uint64_t seq, const coll::Algorithm& algorithm) {
  return std::make_unique<SignatureChecked>(args, comm, base_tag, seq, algorithm);
}

}  // namespace dlop::sched
