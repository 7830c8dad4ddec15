// Transform specs: a full spec parses and round-trips; every kind of mistake
// is an error that says where it is.
#include <gtest/gtest.h>

#include "offload/pipeline.hpp"
#include "offload/spec.hpp"

namespace dlop::offload {
namespace {

constexpr const char* kImagenet = R"({
  "ops": [{"op": "random_resized_crop", "size": 224, "scale": [0.2, 1.0]},
          {"op": "hflip", "p": 0.5},
          {"op": "normalize", "mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225]}],
  "output": "float32", "on_error": "skip"})";

TEST(Spec, ParsesAndRoundTrips) {
  const TransformSpec spec = TransformSpec::from_json(kImagenet);
  ASSERT_EQ(spec.ops.size(), 3u);
  const auto& rrc = std::get<RandomResizedCropOp>(spec.ops[0]);
  EXPECT_EQ(rrc.size, (Size2{224, 224}));
  EXPECT_EQ(rrc.scale, (std::array<double, 2>{0.2, 1.0}));
  EXPECT_DOUBLE_EQ(rrc.ratio[0], 0.75);
  EXPECT_EQ(std::get<HFlipOp>(spec.ops[1]).p, 0.5);
  EXPECT_EQ(std::get<NormalizeOp>(spec.ops[2]).std[2], 0.225f);
  EXPECT_EQ(spec.on_error, ErrorPolicy::kSkip);

  const TransformSpec again = TransformSpec::from_json(spec.to_json());
  EXPECT_EQ(again.to_json(), spec.to_json());
  EXPECT_EQ(std::get<NormalizeOp>(again.ops[2]).mean, std::get<NormalizeOp>(spec.ops[2]).mean);
  EXPECT_EQ(Pipeline(again).fixed_shape(), (Shape{3, 224, 224}));
}

TEST(Spec, DefaultsAndShapes) {
  const TransformSpec spec = TransformSpec::from_json(R"({"ops": [{"op": "resize", "size": 256}]})");
  EXPECT_EQ(spec.output, OutputType::kFloat32);
  EXPECT_EQ(spec.on_error, ErrorPolicy::kRaise);
  EXPECT_EQ(std::get<ResizeOp>(spec.ops[0]).shorter, 256);
  EXPECT_FALSE(Pipeline(spec).fixed_shape().has_value());  // depends on the input's aspect
  const auto eval = Pipeline::from_json(
      R"({"ops": [{"op": "resize", "size": 256}, {"op": "center_crop", "size": [224, 200]}], "output": "uint8"})");
  EXPECT_EQ(eval.fixed_shape(), (Shape{3, 224, 200}));
  EXPECT_EQ(eval.element_size(), 1u);
  EXPECT_EQ(Pipeline::from_json(R"({"ops": [{"op": "resize", "size": [32, 48]}]})").fixed_shape(), (Shape{3, 32, 48}));
}

void expect_spec_error(const char* json, const std::string& fragment) {
  try {
    TransformSpec::from_json(json);
    ADD_FAILURE() << "accepted: " << json;
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << "message: " << e.what();
  }
}

TEST(Spec, ErrorsSayWhereAndWhat) {
  expect_spec_error("{", "transform spec: JSON");
  expect_spec_error("[]", "top level: expected an object");
  expect_spec_error(R"({})", "\"ops\" must be a list");
  expect_spec_error(R"({"ops": [], "outptu": "uint8"})", "top level: unknown key \"outptu\"");
  expect_spec_error(R"({"ops": [{"op": "rotate"}]})", "ops[0] (rotate): unknown op");
  expect_spec_error(R"({"ops": [{"size": 3}]})", "ops[0]: each op must be an object with an \"op\" name");
  expect_spec_error(R"({"ops": [{"op": "hflip", "p": 1.5}]})", "ops[0] (hflip): \"p\" must be a number in [0, 1], got 1.5");
  expect_spec_error(R"({"ops": [{"op": "hflip", "prob": 0.5}]})", "ops[0] (hflip): unknown key \"prob\"");
  expect_spec_error(R"({"ops": [{"op": "hflip"}, {"op": "center_crop"}]})", "ops[1] (center_crop): missing \"size\"");
  expect_spec_error(R"({"ops": [{"op": "center_crop", "size": -4}]})", "\"size\" must be a positive integer or [height, width]");
  expect_spec_error(R"({"ops": [{"op": "center_crop", "size": [1, 2, 3]}]})", "got [1,2,3]");
  expect_spec_error(R"({"ops": [{"op": "random_resized_crop", "size": 8, "scale": [1.0, 0.5]}]})",
                    "\"scale\" must be [low, high]");
  expect_spec_error(R"({"ops": [{"op": "resize", "size": [8, 8], "max_size": 10}]})", "\"max_size\" needs");
  expect_spec_error(R"({"ops": [{"op": "normalize", "mean": [0, 0], "std": [1, 1, 1]}]})", "\"mean\" must be a list of 3");
  expect_spec_error(R"({"ops": [{"op": "normalize", "mean": [0, 0, 0], "std": [1, 0, 1]}]})", "non-zero");
  expect_spec_error(R"({"ops": [{"op": "normalize", "mean": [0, 0, 0], "std": [1, 1, 1]}, {"op": "hflip"}]})",
                    "ops[0] (normalize): normalize must be the last op");
  expect_spec_error(R"({"ops": [{"op": "normalize", "mean": [0, 0, 0], "std": [1, 1, 1]}], "output": "uint8"})",
                    "\"output\" is \"uint8\"");
  expect_spec_error(R"({"ops": [], "output": "float16"})", "\"output\" must be \"float32\" or \"uint8\"");
  expect_spec_error(R"({"ops": [], "on_error": "ignore"})", "\"on_error\" must be \"raise\" or \"skip\"");
}

TEST(Spec, ValidateChecksSpecsBuiltInCpp) {
  TransformSpec spec;
  spec.ops.push_back(HFlipOp{2.0});
  EXPECT_THROW(Pipeline{spec}, Error);
  spec.ops = {ResizeOp{}};  // neither size nor shorter
  EXPECT_THROW(spec.validate(), Error);
}

}  // namespace
}  // namespace dlop::offload
