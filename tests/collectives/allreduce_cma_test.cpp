// The single-copy (cma) all-reduce against a reference computed per element.
#include <gtest/gtest.h>

#include <cmath>

#include "collectives/reduce.hpp"
#include "common/coll_harness.hpp"
#include "common/multiprocess.hpp"

namespace dlop::coll {
namespace {

using namespace std::chrono_literals;

// Small integers: exact in every dtype used here, so results compare exactly.
double input(int rank, std::size_t i) { return static_cast<double>((i * 7 + static_cast<std::size_t>(rank) * 3) % 11); }

double expected(ReduceOp op, int n, std::size_t i) {
  double acc = input(0, i);
  for (int r = 1; r < n; ++r) {
    const double x = input(r, i);
    acc = op == ReduceOp::kMax ? std::max(acc, x) : op == ReduceOp::kMin ? std::min(acc, x) : acc + x;
  }
  return op == ReduceOp::kAvg ? std::trunc(acc / n * 1024) / 1024 : acc;  // avg compared at 2^-10
}

struct Case {
  int ranks;
  std::size_t count;
  ReduceOp op;
  bool in_place;
};

class CmaAllreduce : public ::testing::TestWithParam<Case> {};

TEST_P(CmaAllreduce, MatchesReference) {
  const Case c = GetParam();
  test::run_ranks(c.ranks, [c](transport::Bootstrap& b) {
    transport::UcxWorker worker;
    transport::Mesh mesh(worker, b);
    std::vector<int> members(static_cast<std::size_t>(b.size()));
    for (int r = 0; r < b.size(); ++r) members[static_cast<std::size_t>(r)] = r;
    Group group(mesh, members);
    std::vector<float> send(c.count), recv(c.count, -1.0f);
    for (std::size_t i = 0; i < c.count; ++i) send[i] = static_cast<float>(input(b.rank(), i));
    CollArgs args{.kind = CollKind::kAllreduce, .send = send.data(), .recv = c.in_place ? send.data() : recv.data(),
                  .count = c.count, .dtype = DataType::kFloat32, .op = c.op};
    test::run_collective(group, args, "cma", 1u << 12);
    const std::vector<float>& out = c.in_place ? send : recv;
    std::size_t wrong = 0;
    for (std::size_t i = 0; i < c.count; ++i) {
      const double got = c.op == ReduceOp::kAvg ? std::trunc(static_cast<double>(out[i]) * 1024) / 1024 : out[i];
      if (std::abs(got - expected(c.op, b.size(), i)) > 1e-3) ++wrong;
    }
    EXPECT_EQ(wrong, 0u) << "of " << c.count;
    mesh.fence(30s);
  });
}

std::vector<Case> cases() {
  std::vector<Case> all;
  for (const int ranks : {2, 3, 5}) {
    for (const std::size_t count : {std::size_t{1}, std::size_t{7}, std::size_t{1023}, std::size_t{(1u << 20) + 3}}) {
      for (const ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax, ReduceOp::kAvg}) {
        for (const bool in_place : {false, true}) all.push_back({ranks, count, op, in_place});
      }
    }
  }
  return all;
}

INSTANTIATE_TEST_SUITE_P(RanksCountsOps, CmaAllreduce, ::testing::ValuesIn(cases()), [](const auto& param_info) {
  const Case& c = param_info.param;
  return "ranks" + std::to_string(c.ranks) + "_count" + std::to_string(c.count) + "_" +
         std::string(op_name(c.op)) + (c.in_place ? "_inplace" : "_outofplace");
});

TEST(CmaAllreduceSelection, DeclinesAcrossHostsAndOnOneRank) {
  test::run_ranks(2, [](transport::Bootstrap& b) {
    transport::UcxWorker worker;
    transport::Mesh::Options options;
    options.host = "host-" + std::to_string(b.rank());
    transport::Mesh mesh(worker, b, options);
    Group both(mesh, {0, 1});
    Group alone(mesh, {b.rank()});
    float x = 1;
    const CollArgs args{.kind = CollKind::kAllreduce, .send = &x, .recv = &x, .count = 1, .dtype = DataType::kFloat32};
    const Algorithm& cma = test::find_algorithm(CollKind::kAllreduce, "cma");
    EXPECT_FALSE(cma.accepts(args, both));
    EXPECT_FALSE(cma.accepts(args, alone));
    mesh.fence(30s);
  });
}

}  // namespace
}  // namespace dlop::coll
