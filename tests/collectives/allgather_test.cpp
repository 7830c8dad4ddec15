// Allgather ("ring", "bruck") and allgather-v ("ring") between real
// processes: ranks x counts x element sizes, out of place and both in-place
// forms (send == recv, send == this rank's block of recv: MPI_IN_PLACE, the
// block is already there), checked byte by byte against the senders' patterns.
#include <gtest/gtest.h>

#include <cstring>
#include <ostream>

#include "reduction_check.hpp"

namespace dlop::coll {
namespace {

using namespace ref;

std::byte pattern(int rank, std::size_t i) {
  return static_cast<std::byte>((i * 131u + i / 251u) ^ (static_cast<std::size_t>(rank) * 37u + 1u));
}

struct Variant {
  CollKind kind;
  const char* algo;
};
void PrintTo(const Variant& v, std::ostream* os) { *os << kind_name(v.kind) << ":" << v.algo; }

template <typename NextTag>
void allgather_case(const Group& g, NextTag& next_tag, Variant variant, DataType dtype, std::size_t count,
                    Placement place) {
  const auto me = static_cast<std::size_t>(g.rank());
  const std::size_t esize = dtype_size(dtype);
  const std::vector<std::size_t> counts = block_counts(variant.kind == CollKind::kAllgatherv, g.size(), count);
  std::vector<std::size_t> at(counts.size(), 0);  // bytes
  for (std::size_t b = 1; b < counts.size(); ++b) at[b] = at[b - 1] + counts[b - 1] * esize;
  const std::size_t total = at.back() + counts.back() * esize;

  std::vector<std::byte> mine(counts[me] * esize);
  for (std::size_t i = 0; i < mine.size(); ++i) mine[i] = pattern(g.rank(), i);
  std::vector<std::byte> recv(total + kGuardBytes, std::byte{kGuard});
  CollArgs args;
  args.kind = variant.kind;
  args.dtype = dtype;
  args.count = count;
  if (variant.kind == CollKind::kAllgatherv) args.counts = counts;
  args.send = mine.data();
  args.recv = recv.data();
  if (place != Placement::kApart) {
    if (!mine.empty()) std::memcpy(recv.data() + at[me], mine.data(), mine.size());
    args.send = place == Placement::kSameBuffer ? recv.data() : recv.data() + at[me];
  }
  run(g, args, variant.algo, next_tag());

  const std::string what = std::string(kind_name(variant.kind)) + " " + variant.algo + " " +
                           std::string(dtype_name(dtype)) + " " + placement_name(place);
  for (std::size_t b = 0; b < counts.size(); ++b) {
    long wrong = -1;
    for (std::size_t i = 0; i < counts[b] * esize && wrong < 0; ++i) {
      if (recv[at[b] + i] != pattern(static_cast<int>(b), i)) wrong = static_cast<long>(i);
    }
    EXPECT_EQ(wrong, -1) << what << ": block of rank " << b << " wrong from byte " << wrong;
  }
  EXPECT_TRUE(guard_intact(recv, total)) << what << ": wrote past the end";
}

constexpr Variant kVariants[] = {
    {CollKind::kAllgather, "ring"}, {CollKind::kAllgather, "bruck"}, {CollKind::kAllgatherv, "ring"}};
constexpr DataType kDtypes[] = {DataType::kUInt8, DataType::kFloat16, DataType::kFloat32, DataType::kInt64};

class AllgatherGrid : public ::testing::TestWithParam<std::tuple<Variant, int, std::size_t>> {};

TEST_P(AllgatherGrid, EveryElementSizeEveryPlacement) {
  const auto [variant, ranks, count] = GetParam();
  on_ranks(ranks, [&](const Group& g, auto next_tag, transport::Bootstrap&) {
    for (const DataType dtype : kDtypes) {
      for (const Placement place : {Placement::kApart, Placement::kSameBuffer, Placement::kOwnBlock}) {
        // At 1Mi+3 elements: one element size, out of place and one in-place form.
        if (count == kLargeCount && (dtype != DataType::kFloat32 || place == Placement::kSameBuffer)) continue;
        allgather_case(g, next_tag, variant, dtype, count, place);
      }
    }
  });
}

INSTANTIATE_TEST_SUITE_P(Grid, AllgatherGrid,
                         ::testing::Combine(::testing::ValuesIn(kVariants), ::testing::Values(1, 2, 3, 4, 5),
                                            ::testing::Values(0u, 1u, 7u, 1023u, kLargeCount)),
                         [](const auto& param_info) {
                           const Variant v = std::get<0>(param_info.param);
                           return std::string(kind_name(v.kind)) + "_" + v.algo + "_ranks" +
                                  std::to_string(std::get<1>(param_info.param)) + "_count" +
                                  std::to_string(std::get<2>(param_info.param));
                         });

}  // namespace
}  // namespace dlop::coll
