#include <cstring>

#include "media/ops.hpp"

namespace dlop::media {
namespace {

// Walks the image row by row, handing `put` each output position and the
// input pixel that lands there (read from the row's far end when mirroring).
template <class Put>
void each_pixel(const Image& image, Mirror mirror, Put&& put) {
  const std::size_t width = static_cast<std::size_t>(image.width);
  for (int y = 0; y < image.height; ++y) {
    const std::uint8_t* row = image.pixels.data() + static_cast<std::size_t>(y) * image.row_bytes();
    const std::size_t base = static_cast<std::size_t>(y) * width;
    if (mirror == Mirror::kYes) {
      const std::uint8_t* px = row + (width - 1) * 3;
      for (std::size_t x = 0; x < width; ++x, px -= 3) put(base + x, px);
    } else {
      const std::uint8_t* px = row;
      for (std::size_t x = 0; x < width; ++x, px += 3) put(base + x, px);
    }
  }
}

}  // namespace

void to_chw_uint8(const Image& image, std::uint8_t* out, Mirror mirror) {
  const std::size_t plane = static_cast<std::size_t>(image.height) * image.width;
  each_pixel(image, mirror, [&](std::size_t i, const std::uint8_t* px) {
    out[i] = px[0];
    out[plane + i] = px[1];
    out[2 * plane + i] = px[2];
  });
}

void to_chw_float(const Image& image, const std::array<float, 3>& mean, const std::array<float, 3>& std,
                  float* out, Mirror mirror) {
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
  each_pixel(image, mirror, [&](std::size_t i, const std::uint8_t* px) {
    out[i] = table[0][px[0]];
    out[plane + i] = table[1][px[1]];
    out[2 * plane + i] = table[2][px[2]];
  });
}

}  // namespace dlop::media
