#include <gtest/gtest.h>

#include "collectives/coll_args.hpp"
#include "collectives/registry.hpp"
#include "core/error.hpp"

namespace dlop::coll {
namespace {

TEST(Types, BitwiseReductionsOnFloatsAreRejectedNamingBoth) {
  for (const ReduceOp op : {ReduceOp::kBand, ReduceOp::kBor, ReduceOp::kBxor}) {
    for (const DataType dtype : {DataType::kFloat32, DataType::kFloat64, DataType::kFloat16, DataType::kBFloat16}) {
      EXPECT_FALSE(supports(op, dtype));
      try {
        check_reduction(op, dtype);
        ADD_FAILURE() << "accepted " << op_name(op) << " on " << dtype_name(dtype);
      } catch (const Error& e) {
        EXPECT_EQ(e.code(), Errc::kInvalidArgument);
        EXPECT_NE(std::string(e.what()).find(std::string(op_name(op))), std::string::npos);
        EXPECT_NE(std::string(e.what()).find(std::string(dtype_name(dtype))), std::string::npos);
      }
    }
  }
  EXPECT_TRUE(supports(ReduceOp::kBxor, DataType::kInt32));
  EXPECT_TRUE(supports(ReduceOp::kBand, DataType::kBool));
}

TEST(Types, NamesRoundTrip) {
  for (int d = 0; d <= static_cast<int>(DataType::kBool); ++d) {
    EXPECT_EQ(parse_dtype(dtype_name(static_cast<DataType>(d))), static_cast<DataType>(d));
  }
  for (int o = 0; o <= static_cast<int>(ReduceOp::kBxor); ++o) {
    EXPECT_EQ(parse_op(op_name(static_cast<ReduceOp>(o))), static_cast<ReduceOp>(o));
  }
  for (int k = 0; k <= static_cast<int>(CollKind::kBarrier); ++k) {
    EXPECT_EQ(parse_kind(kind_name(static_cast<CollKind>(k))), static_cast<CollKind>(k));
  }
  EXPECT_THROW(parse_dtype("complex"), Error);
}

TEST(Registry, OverridesNameUnknownEntries) {
  EXPECT_THROW(AlgorithmOverrides::parse("allreduce"), Error);
  EXPECT_THROW(AlgorithmOverrides::parse("nosuchop:ring"), Error);
  EXPECT_THROW(AlgorithmOverrides::parse("allreduce:nosuchalgo"), Error);
  EXPECT_TRUE(AlgorithmOverrides::parse("").forced.empty());
}

}  // namespace
}  // namespace dlop::coll
