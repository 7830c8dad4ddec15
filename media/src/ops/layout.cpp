#include <cstring>

#include "media/ops.hpp"

namespace dlop::media {

void to_chw_uint8(const Image& image, std::uint8_t* out) {
  const std::size_t plane = static_cast<std::size_t>(image.height) * image.width;
  const std::uint8_t* in = image.pixels.data();
  for (std::size_t i = 0; i < plane; ++i) {
    out[i] = in[i * 3];
    out[plane + i] = in[i * 3 + 1];
    out[2 * plane + i] = in[i * 3 + 2];
  }
}

void to_chw_float(const Image& image, const std::array<float, 3>& mean, const std::array<float, 3>& std,
                  float* out) {
  // 256 possible inputs per channel: a table computed with torchvision's exact
  // float32 steps is both bitwise equal to it and faster than the arithmetic.
  float table[3][256];
  for (int c = 0; c < 3; ++c) {
    for (int v = 0; v < 256; ++v) {
      const float scaled = static_cast<float>(v) / 255.0f;
      table[c][v] = (scaled - mean[static_cast<std::size_t>(c)]) / std[static_cast<std::size_t>(c)];
    }
  }
  const std::size_t plane = static_cast<std::size_t>(image.height) * image.width;
  const std::uint8_t* in = image.pixels.data();
  for (std::size_t i = 0; i < plane; ++i) {
    out[i] = table[0][in[i * 3]];
    out[plane + i] = table[1][in[i * 3 + 1]];
    out[2 * plane + i] = table[2][in[i * 3 + 2]];
  }
}

}  // namespace dlop::media
