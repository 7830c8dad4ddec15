// The transform spec: a small, serialisable description of a pipeline, parsed
// from JSON such as
//   {"ops": [{"op": "random_resized_crop", "size": 224},
//            {"op": "hflip", "p": 0.5},
//            {"op": "normalize", "mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225]}],
//    "output": "float32", "on_error": "skip"}
// Every field but "ops" has a default; unknown ops, unknown keys and bad
// values are errors naming the op's position and the field.
#pragma once

#include <array>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace dlop::offload {

// A size: {height, width}; JSON "size": 224 means {224, 224} except in
// resize, where one number is the shorter side (see ResizeOp).
using Size2 = std::array<int, 2>;

struct RandomResizedCropOp {
  Size2 size{224, 224};
  std::array<double, 2> scale{0.08, 1.0};
  std::array<double, 2> ratio{3.0 / 4.0, 4.0 / 3.0};
  bool antialias = true;
};

struct ResizeOp {
  // Exactly {height, width}; or, when `shorter` is set, the shorter side,
  // the other following the aspect ratio (torchvision's Resize(int)).
  std::optional<Size2> size;
  std::optional<int> shorter;
  int max_size = 0;  // 0: none; only with `shorter`
  bool antialias = true;
};

struct CenterCropOp {
  Size2 size{224, 224};
};

struct HFlipOp {
  double p = 0.5;
};

// Must be the last op; makes the output float32.
struct NormalizeOp {
  std::array<float, 3> mean{0.0f, 0.0f, 0.0f};
  std::array<float, 3> std{1.0f, 1.0f, 1.0f};
};

using OpSpec = std::variant<RandomResizedCropOp, ResizeOp, CenterCropOp, HFlipOp, NormalizeOp>;

// float32: values / 255 (then normalised if the last op is normalize).
// uint8: the pixels as they are, CHW; not allowed with normalize.
enum class OutputType { kFloat32, kUint8 };

// What a sample that cannot be read or decoded does: raise (the default)
// fails the call; skip leaves it out of its batch and counts it.
enum class ErrorPolicy { kRaise, kSkip };

struct TransformSpec {
  std::vector<OpSpec> ops;
  OutputType output = OutputType::kFloat32;
  ErrorPolicy on_error = ErrorPolicy::kRaise;

  // Throws dlop::Error(kInvalidArgument) with the op's index and field.
  static TransformSpec from_json(std::string_view json);
  std::string to_json() const;
  // Same checks as from_json, for specs built in C++.
  void validate() const;
};

std::string_view op_name(const OpSpec& op);

}  // namespace dlop::offload
