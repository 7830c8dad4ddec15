// Decoded images and the errors a single sample can raise.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/error.hpp"

namespace dlop::media {

// 8-bit RGB, rows top to bottom, pixels interleaved (HWC): what every decoder
// produces and every geometric op takes and returns.
struct Image {
  int height = 0;
  int width = 0;
  std::vector<std::uint8_t> pixels;  // height * width * 3

  static constexpr int kChannels = 3;
  std::size_t row_bytes() const { return static_cast<std::size_t>(width) * kChannels; }
  // Resizes `pixels` for the new shape (contents unspecified) and keeps its capacity.
  void reshape(int h, int w) {
    height = h;
    width = w;
    pixels.resize(static_cast<std::size_t>(h) * row_bytes());
  }
};

// Something wrong with one sample's data (unreadable, corrupt, truncated, empty,
// unsupported): the pipeline's error policy decides whether it skips the sample
// or raises. Errors in the spec or in the caller's arguments are plain
// dlop::Error and always raise.
class SampleError : public Error {
 public:
  SampleError(std::string sample, std::string reason);
  const std::string& sample() const { return sample_; }
  const std::string& reason() const { return reason_; }

 private:
  std::string sample_;
  std::string reason_;
};

}  // namespace dlop::media
