// The transform spec: a small, serialisable description of a pipeline, parsed
// from JSON such as
//   {"ops": [{"op": "random_resized_crop", "size": 224},
//            {"op": "hflip", "p": 0.5},
//            {"op": "normalize", "mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225]}],
//    "output": "float32", "on_error": "skip", "load_truncated_images": false}
// The ops and their parameters are the table in transform_ops.hpp. Every
// field but "ops" has a default; unknown ops, unknown keys and bad values are
// errors naming the op's position and the field.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "media/transform_ops.hpp"

namespace dlop::media {

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
  // PIL.ImageFile.LOAD_TRUNCATED_IMAGES (DecodeOptions::load_truncated). Only
  // written to JSON when true, so a daemon that predates it reads every other
  // spec, and refuses this one by naming the key.
  bool load_truncated_images = false;

  // Throws dlop::Error(kInvalidArgument) with the op's index and field.
  static TransformSpec from_json(std::string_view json);
  std::string to_json() const;
  // Same checks as from_json, for specs built in C++.
  void validate() const;
};

// The op table as JSON, for tools and Python: [{"op": name, "params": [{"name",
// "kind", "required", "default" (when not required), "expected"}, ...]}, ...].
std::string describe_ops();

}  // namespace dlop::media
