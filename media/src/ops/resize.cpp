// Separable resampling with PIL's conventions (the reference torchvision
// follows for antialiased resizing): each output pixel's centre maps back to
// in = (out + 0.5) * scale; the triangle filter, widened by the shrink factor
// when antialiasing, weighs the input pixels around it; weights are normalised,
// then rounded to 22-bit fixed point so the 8-bit sums are exact integers.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "media/ops.hpp"

namespace dlop::media {
namespace {

constexpr int kPrecisionBits = 32 - 8 - 2;

// The two passes are cloned for AVX2 (chosen at load time by the dynamic
// linker): the vertical pass is a 32-bit multiply-add along whole rows, which
// SSE2 can only emulate.
#define DLOP_CLONES __attribute__((target_clones("avx2", "default")))

struct Coefficients {
  int taps = 0;                       // weights per output pixel (some trailing zeros)
  std::vector<int> first;             // first input pixel of each output pixel
  std::vector<int> count;             // input pixels used
  std::vector<std::int32_t> weights;  // out_size * taps
};

double triangle(double x) {
  x = std::fabs(x);
  return x < 1.0 ? 1.0 - x : 0.0;
}

// Output pixel i of out_size reads pixels [first, first + count) of the
// in_size pixels of the box (relative to the box; the caller adds its offset).
Coefficients coefficients(int in_size, int out_size, bool antialias) {
  const double scale = static_cast<double>(in_size) / out_size;
  const double filter_scale = antialias ? std::max(scale, 1.0) : 1.0;
  const double support = 1.0 * filter_scale;
  Coefficients c;
  c.taps = static_cast<int>(std::ceil(support)) * 2 + 1;
  c.first.resize(static_cast<std::size_t>(out_size));
  c.count.resize(static_cast<std::size_t>(out_size));
  c.weights.assign(static_cast<std::size_t>(out_size) * static_cast<std::size_t>(c.taps), 0);
  std::vector<double> w(static_cast<std::size_t>(c.taps));
  for (int i = 0; i < out_size; ++i) {
    const double centre = (i + 0.5) * scale;
    const int lo = std::max(static_cast<int>(centre - support + 0.5), 0);
    const int hi = std::min(static_cast<int>(centre + support + 0.5), in_size);
    const int n = hi - lo;
    double total = 0.0;
    for (int k = 0; k < n; ++k) {
      w[static_cast<std::size_t>(k)] = triangle((k + lo - centre + 0.5) / filter_scale);
      total += w[static_cast<std::size_t>(k)];
    }
    std::int32_t* out = &c.weights[static_cast<std::size_t>(i) * static_cast<std::size_t>(c.taps)];
    for (int k = 0; k < n; ++k) {
      const double v = total != 0.0 ? w[static_cast<std::size_t>(k)] / total : 0.0;
      // Round half away from zero, as PIL does.
      out[k] = static_cast<std::int32_t>(v < 0 ? -0.5 + v * (1 << kPrecisionBits) : 0.5 + v * (1 << kPrecisionBits));
    }
    c.first[static_cast<std::size_t>(i)] = lo;
    c.count[static_cast<std::size_t>(i)] = n;
  }
  return c;
}

std::uint8_t clip8(std::int32_t v) {
  if (v <= 0) return 0;
  if (v >= (256 << kPrecisionBits)) return 255;
  return static_cast<std::uint8_t>(v >> kPrecisionBits);
}

// Rows [row0, row0 + rows) of src, columns of the box, to dst (rows x out_w).
DLOP_CLONES void horizontal(const Image& src, int row0, int rows, int col0, const Coefficients& c, int out_w, Image& dst) {
  dst.reshape(rows, out_w);
  for (int y = 0; y < rows; ++y) {
    const std::uint8_t* in = src.pixels.data() + static_cast<std::size_t>(row0 + y) * src.row_bytes();
    std::uint8_t* out = dst.pixels.data() + static_cast<std::size_t>(y) * dst.row_bytes();
    for (int x = 0; x < out_w; ++x) {
      const std::int32_t* w = &c.weights[static_cast<std::size_t>(x) * static_cast<std::size_t>(c.taps)];
      const std::uint8_t* p = in + static_cast<std::size_t>(col0 + c.first[static_cast<std::size_t>(x)]) * 3;
      std::int32_t r = 1 << (kPrecisionBits - 1), g = r, b = r;
      for (int k = 0; k < c.count[static_cast<std::size_t>(x)]; ++k, p += 3) {
        r += p[0] * w[k];
        g += p[1] * w[k];
        b += p[2] * w[k];
      }
      out[x * 3] = clip8(r);
      out[x * 3 + 1] = clip8(g);
      out[x * 3 + 2] = clip8(b);
    }
  }
}

// Rows [row0 + first, ...) of src (full width) to dst's out_h rows. The inner
// loop runs along a whole row, so the compiler vectorises it.
DLOP_CLONES void vertical(const Image& src, int row0, const Coefficients& c, int out_h, Image& dst) {
  dst.reshape(out_h, src.width);
  const std::size_t n = src.row_bytes();
  std::vector<std::int32_t> acc(n);
  for (int y = 0; y < out_h; ++y) {
    std::fill(acc.begin(), acc.end(), 1 << (kPrecisionBits - 1));
    const std::int32_t* w = &c.weights[static_cast<std::size_t>(y) * static_cast<std::size_t>(c.taps)];
    for (int k = 0; k < c.count[static_cast<std::size_t>(y)]; ++k) {
      const std::uint8_t* in =
          src.pixels.data() + static_cast<std::size_t>(row0 + c.first[static_cast<std::size_t>(y)] + k) * n;
      const std::int32_t wk = w[k];
      for (std::size_t i = 0; i < n; ++i) acc[i] += in[i] * wk;
    }
    std::uint8_t* out = dst.pixels.data() + static_cast<std::size_t>(y) * n;
    for (std::size_t i = 0; i < n; ++i) out[i] = clip8(acc[i]);
  }
}

}  // namespace

void resize(const Image& src, const CropBox& box, int out_height, int out_width, bool antialias, Image& dst) {
  if (&src == &dst) throw_error(Errc::kInvalidArgument, "resize: dst must not be src");
  if (out_height <= 0 || out_width <= 0) throw_error(Errc::kInvalidArgument, "resize: empty output size");
  if (box.top < 0 || box.left < 0 || box.height <= 0 || box.width <= 0 || box.top + box.height > src.height ||
      box.left + box.width > src.width) {
    throw_error(Errc::kInvalidArgument, "resize: box outside the image");
  }
  const bool horizontal_pass = out_width != box.width;
  const bool vertical_pass = out_height != box.height;
  if (!horizontal_pass && !vertical_pass) return crop(src, box, dst);
  if (!vertical_pass) {
    return horizontal(src, box.top, box.height, box.left, coefficients(box.width, out_width, antialias), out_width,
                      dst);
  }
  // Only the rows the vertical pass reads go through the horizontal one.
  const Coefficients vc = coefficients(box.height, out_height, antialias);
  const int first = vc.first.front();
  const int last = vc.first.back() + vc.count.back();
  Image tmp;
  if (horizontal_pass) {
    horizontal(src, box.top + first, last - first, box.left, coefficients(box.width, out_width, antialias),
               out_width, tmp);
  } else {
    crop(src, CropBox{box.top + first, box.left, last - first, box.width}, tmp);
  }
  vertical(tmp, -first, vc, out_height, dst);
}

Image resize(const Image& src, int out_height, int out_width, bool antialias) {
  Image dst;
  resize(src, CropBox{0, 0, src.height, src.width}, out_height, out_width, antialias, dst);
  return dst;
}

}  // namespace dlop::media
