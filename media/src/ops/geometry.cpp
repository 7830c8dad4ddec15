// Crop boxes and output sizes computed exactly as torchvision computes them
// (Python's round is half-to-even: std::nearbyint in the default rounding mode).
#include <algorithm>
#include <cmath>
#include <cstring>

#include "media/ops.hpp"

namespace dlop::media {

CropBox random_resized_crop_box(int height, int width, std::array<double, 2> scale, std::array<double, 2> ratio,
                                SampleRng& rng) {
  const double area = static_cast<double>(height) * width;
  const double log_lo = std::log(ratio[0]);
  const double log_hi = std::log(ratio[1]);
  for (int attempt = 0; attempt < 10; ++attempt) {
    const double target_area = area * rng.uniform(scale[0], scale[1]);
    const double aspect = std::exp(rng.uniform(log_lo, log_hi));
    const int w = static_cast<int>(std::nearbyint(std::sqrt(target_area * aspect)));
    const int h = static_cast<int>(std::nearbyint(std::sqrt(target_area / aspect)));
    if (0 < w && w <= width && 0 < h && h <= height) {
      const int top = static_cast<int>(rng.randint(0, height - h + 1));
      const int left = static_cast<int>(rng.randint(0, width - w + 1));
      return CropBox{top, left, h, w};
    }
  }
  const double in_ratio = static_cast<double>(width) / height;
  const double lo = std::min(ratio[0], ratio[1]);
  const double hi = std::max(ratio[0], ratio[1]);
  int w = width;
  int h = height;
  if (in_ratio < lo) {
    h = static_cast<int>(std::nearbyint(w / lo));
  } else if (in_ratio > hi) {
    w = static_cast<int>(std::nearbyint(h * hi));
  }
  return CropBox{(height - h) / 2, (width - w) / 2, h, w};
}

CropBox center_crop_box(int height, int width, int crop_height, int crop_width) {
  // torchvision pads a too-small side by (crop - size) // 2 on the top/left,
  // and otherwise rounds the offset half to even.
  const auto offset = [](int size, int crop) {
    return crop > size ? -((crop - size) / 2) : static_cast<int>(std::nearbyint((size - crop) / 2.0));
  };
  return CropBox{offset(height, crop_height), offset(width, crop_width), crop_height, crop_width};
}

std::pair<int, int> resize_shorter_side(int height, int width, int size, int max_size) {
  if (size <= 0) throw_error(Errc::kInvalidArgument, "resize: size must be positive");
  const bool portrait = width <= height;
  const int shorter = portrait ? width : height;
  const int longer = portrait ? height : width;
  int new_short = size;
  int new_long = static_cast<int>(static_cast<double>(size) * longer / shorter);
  if (max_size > 0) {
    if (max_size <= size) throw_error(Errc::kInvalidArgument, "resize: max_size must be larger than size");
    if (new_long > max_size) {
      new_short = static_cast<int>(static_cast<double>(max_size) * new_short / new_long);
      new_long = max_size;
    }
  }
  return portrait ? std::pair{new_long, new_short} : std::pair{new_short, new_long};
}

void crop(const Image& src, const CropBox& box, Image& dst) {
  if (&src == &dst) throw_error(Errc::kInvalidArgument, "crop: dst must not be src");
  if (box.height <= 0 || box.width <= 0) throw_error(Errc::kInvalidArgument, "crop: empty box");
  dst.reshape(box.height, box.width);
  const int x0 = std::max(box.left, 0);
  const int x1 = std::min(box.left + box.width, src.width);
  for (int y = 0; y < box.height; ++y) {
    std::uint8_t* out = dst.pixels.data() + static_cast<std::size_t>(y) * dst.row_bytes();
    const int sy = box.top + y;
    if (sy < 0 || sy >= src.height || x0 >= x1) {
      std::memset(out, 0, dst.row_bytes());
      continue;
    }
    const std::size_t before = static_cast<std::size_t>(x0 - box.left) * 3;
    const std::size_t inside = static_cast<std::size_t>(x1 - x0) * 3;
    std::memset(out, 0, before);
    std::memcpy(out + before, src.pixels.data() + static_cast<std::size_t>(sy) * src.row_bytes() + x0 * 3, inside);
    std::memset(out + before + inside, 0, dst.row_bytes() - before - inside);
  }
}

void hflip(Image& image) {
  for (int y = 0; y < image.height; ++y) {
    std::uint8_t* row = image.pixels.data() + static_cast<std::size_t>(y) * image.row_bytes();
    for (int l = 0, r = image.width - 1; l < r; ++l, --r) {
      for (int c = 0; c < 3; ++c) std::swap(row[l * 3 + c], row[r * 3 + c]);
    }
  }
}

}  // namespace dlop::media
