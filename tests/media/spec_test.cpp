// Transform specs: a full spec parses and round-trips; every kind of mistake
// is an error that says where it is.
#include <gtest/gtest.h>

#include "media/image_pipeline.hpp"
#include "media/image_spec.hpp"

namespace dlop::media {
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
  EXPECT_EQ(ImagePipeline(again).fixed_shape(), (Shape{3, 224, 224}));
}

TEST(Spec, DefaultsAndShapes) {
  const TransformSpec spec = TransformSpec::from_json(R"({"ops": [{"op": "resize", "size": 256}]})");
  EXPECT_EQ(spec.output, OutputType::kFloat32);
  EXPECT_EQ(spec.on_error, ErrorPolicy::kRaise);
  EXPECT_EQ(std::get<ResizeOp>(spec.ops[0]).shorter, 256);
  EXPECT_FALSE(ImagePipeline(spec).fixed_shape().has_value());  // depends on the input's aspect
  const auto eval = ImagePipeline::from_json(
      R"({"ops": [{"op": "resize", "size": 256}, {"op": "center_crop", "size": [224, 200]}], "output": "uint8"})");
  EXPECT_EQ(eval.fixed_shape(), (Shape{3, 224, 200}));
  EXPECT_EQ(eval.element_size(), 1u);
  EXPECT_EQ(ImagePipeline::from_json(R"({"ops": [{"op": "resize", "size": [32, 48]}]})").fixed_shape(), (Shape{3, 32, 48}));
}

// Written only when set, so a daemon that predates the key reads every spec
// that leaves it out.
TEST(Spec, LoadTruncatedImagesIsReadAndWrittenOnlyWhenSet) {
  const TransformSpec off = TransformSpec::from_json(R"({"ops": []})");
  EXPECT_FALSE(off.load_truncated_images);
  EXPECT_EQ(off.to_json().find("load_truncated_images"), std::string::npos);
  const TransformSpec on = TransformSpec::from_json(R"({"ops": [], "load_truncated_images": true})");
  EXPECT_TRUE(on.load_truncated_images);
  EXPECT_TRUE(TransformSpec::from_json(on.to_json()).load_truncated_images);
  EXPECT_FALSE(TransformSpec::from_json(R"({"ops": [], "load_truncated_images": false})").load_truncated_images);
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
  expect_spec_error(R"({"ops": [], "load_truncated_images": 1})", "\"load_truncated_images\" must be true or false");
}

// The op table is the one list of ops: the parser knows each by its name, the
// unknown-op error and describe_ops() list all of them, and every op
// round-trips through to_json with its parameters.
TEST(Spec, EveryOpOfTheTableParsesAndIsListed) {
  std::string unknown;
  try {
    TransformSpec::from_json(R"({"ops": [{"op": "rotate"}]})");
  } catch (const Error& e) {
    unknown = e.what();
  }
  const std::string described = describe_ops();
  std::size_t ops = 0;
  const auto check = [&]<std::size_t... I>(std::index_sequence<I...>) {
    const auto one = [&](const auto& op) {
      const std::string name(op.kName);
      ++ops;
      EXPECT_NE(unknown.find(name), std::string::npos) << name;
      EXPECT_NE(described.find("\"op\":\"" + name + "\""), std::string::npos) << name;
    };
    (one(std::variant_alternative_t<I, OpSpec>{}), ...);
  };
  check(std::make_index_sequence<std::variant_size_v<OpSpec>>{});
  EXPECT_EQ(ops, 5u);
  const TransformSpec spec = TransformSpec::from_json(
      R"({"ops": [{"op": "resize", "size": 40, "max_size": 50, "antialias": false}, {"op": "center_crop", "size": [30, 20]},
                  {"op": "random_resized_crop", "size": [16, 12], "scale": [0.5, 0.9], "ratio": [0.5, 2]},
                  {"op": "hflip", "p": 0.25}, {"op": "normalize", "mean": [1, 2, 3], "std": [4, 5, 6]}]})");
  EXPECT_EQ(TransformSpec::from_json(spec.to_json()).to_json(), spec.to_json());
  EXPECT_EQ(std::get<ResizeOp>(spec.ops[0]).max_size, 50);
  EXPECT_FALSE(std::get<ResizeOp>(spec.ops[0]).antialias);
  EXPECT_EQ(std::get<CenterCropOp>(spec.ops[1]).size, (Size2{30, 20}));
  EXPECT_EQ(std::get<RandomResizedCropOp>(spec.ops[2]).ratio, (std::array<double, 2>{0.5, 2.0}));
  EXPECT_EQ(std::get<HFlipOp>(spec.ops[3]).p, 0.25);
  EXPECT_EQ(std::get<NormalizeOp>(spec.ops[4]).std, (std::array<float, 3>{4, 5, 6}));
  EXPECT_EQ(ImagePipeline(spec).fixed_shape(), (Shape{3, 16, 12}));
}

TEST(Spec, ValidateChecksSpecsBuiltInCpp) {
  TransformSpec spec;
  spec.ops.push_back(HFlipOp{2.0});
  EXPECT_THROW(ImagePipeline{spec}, Error);
  spec.ops = {ResizeOp{}};  // neither size nor shorter
  EXPECT_THROW(spec.validate(), Error);
  spec.ops = {CenterCropOp{{0, 8}}};
  EXPECT_THROW(spec.validate(), Error);
  spec.ops = {RandomResizedCropOp{.scale = {0.0, 1.0}}};
  EXPECT_THROW(spec.validate(), Error);
  spec.ops = {NormalizeOp{.std = {1.0f, 0.0f, 1.0f}}};
  EXPECT_THROW(spec.validate(), Error);
  spec.ops = {NormalizeOp{}};
  EXPECT_NO_THROW(spec.validate());
}

}  // namespace
}  // namespace dlop::media
