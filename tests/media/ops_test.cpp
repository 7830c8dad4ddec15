// The ops against references computed another way: resizing against a direct
// double-precision evaluation of the antialiased triangle filter, boxes and
// sizes against values worked out by hand from torchvision's definitions.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "media/ops.hpp"
#include "test_data.hpp"

namespace dlop::media {
namespace {

using test::make_image;

// Normalised weights of every input pixel for one output pixel, in double.
std::vector<double> direct_weights(int in_size, int out_size, int i, bool antialias) {
  const double scale = static_cast<double>(in_size) / out_size;
  const double fs = antialias ? std::max(scale, 1.0) : 1.0;
  const double centre = (i + 0.5) * scale;
  std::vector<double> w(static_cast<std::size_t>(in_size));
  double total = 0;
  for (int x = 0; x < in_size; ++x) {
    w[static_cast<std::size_t>(x)] = std::max(0.0, 1.0 - std::fabs((x + 0.5 - centre) / fs));
    total += w[static_cast<std::size_t>(x)];
  }
  for (double& v : w) v /= total;
  return w;
}

Image direct_resize(const Image& src, const CropBox& box, int oh, int ow, bool antialias) {
  Image out;
  out.reshape(oh, ow);
  for (int y = 0; y < oh; ++y) {
    const auto wy = direct_weights(box.height, oh, y, antialias);
    for (int x = 0; x < ow; ++x) {
      const auto wx = direct_weights(box.width, ow, x, antialias);
      for (int c = 0; c < 3; ++c) {
        double v = 0;
        for (int sy = 0; sy < box.height; ++sy) {
          if (wy[sy] == 0) continue;
          for (int sx = 0; sx < box.width; ++sx) {
            v += wy[sy] * wx[sx] * src.pixels[(static_cast<std::size_t>(box.top + sy) * src.width + box.left + sx) * 3 + c];
          }
        }
        out.pixels[(static_cast<std::size_t>(y) * ow + x) * 3 + c] = static_cast<std::uint8_t>(std::clamp(std::lround(v), 0L, 255L));
      }
    }
  }
  return out;
}

int max_diff(const Image& a, const Image& b) {
  int m = 0;
  for (std::size_t i = 0; i < a.pixels.size(); ++i) m = std::max(m, std::abs(a.pixels[i] - b.pixels[i]));
  return m;
}

TEST(Resize, WithinOneLevelOfTheDirectFilter) {
  const Image src = make_image(61, 83, 1);
  struct Case { CropBox box; int oh, ow; bool aa; };
  const Case cases[] = {
      {{0, 0, 61, 83}, 20, 30, true},   // shrink both ways, antialiased
      {{0, 0, 61, 83}, 20, 30, false},  // shrink without antialias: two taps
      {{0, 0, 61, 83}, 100, 150, true}, // enlarge
      {{5, 7, 40, 50}, 24, 24, true},   // a box, as RandomResizedCrop uses
      {{5, 7, 40, 50}, 40, 24, true},   // one pass only (height unchanged)
      {{0, 0, 61, 83}, 61, 40, true},
  };
  for (const Case& c : cases) {
    Image out;
    resize(src, c.box, c.oh, c.ow, c.aa, out);
    ASSERT_EQ(out.height, c.oh);
    ASSERT_EQ(out.width, c.ow);
    // Fixed-point weights and the 8-bit intermediate row cost at most one level.
    EXPECT_LE(max_diff(out, direct_resize(src, c.box, c.oh, c.ow, c.aa)), 1)
        << c.oh << "x" << c.ow << " aa=" << c.aa;
  }
}

TEST(Resize, SameSizeIsACopyAndConstantsStayConstant) {
  const Image src = make_image(30, 40, 2);
  EXPECT_EQ(resize(src, 30, 40).pixels, src.pixels);
  Image flat;
  flat.reshape(50, 70);
  std::fill(flat.pixels.begin(), flat.pixels.end(), std::uint8_t{173});
  for (const auto& [h, w] : {std::pair{13, 9}, std::pair{120, 31}}) {
    const Image out = resize(flat, h, w);
    for (const std::uint8_t v : out.pixels) ASSERT_EQ(v, 173);
  }
}

TEST(Resize, RejectsBadBoxes) {
  const Image src = make_image(10, 10, 3);
  Image out;
  EXPECT_THROW(resize(src, CropBox{5, 5, 6, 5}, 4, 4, true, out), Error);
  EXPECT_THROW(resize(src, CropBox{0, 0, 10, 10}, 0, 4, true, out), Error);
}

TEST(Geometry, ResizeShorterSideAsTorchvision) {
  // torchvision: the shorter side becomes size, the longer int(size * long / short).
  EXPECT_EQ(resize_shorter_side(375, 500, 256), (std::pair{256, 341}));
  EXPECT_EQ(resize_shorter_side(500, 375, 256), (std::pair{341, 256}));
  EXPECT_EQ(resize_shorter_side(300, 300, 224), (std::pair{224, 224}));
  // max_size: 256 * 1000 / 100 = 2560 > 512, so (int(512 * 256 / 2560), 512).
  EXPECT_EQ(resize_shorter_side(100, 1000, 256, 512), (std::pair{51, 512}));
}

TEST(Geometry, CenterCropBoxAsTorchvision) {
  // Offsets round((in - out) / 2) half to even: (375-224)/2 = 75.5 -> 76, (500-224)/2 = 138.
  EXPECT_EQ(center_crop_box(375, 500, 224, 224), (CropBox{76, 138, 224, 224}));
  EXPECT_EQ(center_crop_box(373, 500, 224, 224), (CropBox{74, 138, 224, 224}));  // 74.5 -> 74
  // Larger than the image: padded by (crop - size) // 2 on the top/left.
  EXPECT_EQ(center_crop_box(100, 300, 105, 224), (CropBox{-2, 38, 105, 224}));
}

TEST(Geometry, CropPadsWithZeros) {
  const Image src = make_image(4, 5, 4);
  Image out;
  crop(src, CropBox{-1, 3, 3, 4}, out);
  for (int y = 0; y < 3; ++y) {
    for (int x = 0; x < 4; ++x) {
      const int sy = y - 1, sx = x + 3;
      for (int c = 0; c < 3; ++c) {
        const std::uint8_t want = sy < 0 || sx >= 5 ? 0 : src.pixels[(sy * 5 + sx) * 3 + c];
        ASSERT_EQ(out.pixels[(y * 4 + x) * 3 + c], want) << y << "," << x;
      }
    }
  }
}

TEST(Geometry, RandomResizedCropBoxesStayInsideAndFollowTheirRanges) {
  double area_sum = 0;
  const int n = 20000;
  for (int i = 0; i < n; ++i) {
    SampleRng rng(SampleKey{1, 0, static_cast<std::uint64_t>(i)}, 0);
    const CropBox b = random_resized_crop_box(375, 500, {0.08, 1.0}, {3.0 / 4, 4.0 / 3}, rng);
    ASSERT_GE(b.top, 0);
    ASSERT_GE(b.left, 0);
    ASSERT_LE(b.top + b.height, 375);
    ASSERT_LE(b.left + b.width, 500);
    const double ratio = static_cast<double>(b.width) / b.height;
    // Rounding the sides to integers can push the ratio slightly past its range.
    ASSERT_GT(ratio, 0.75 * 0.95);
    ASSERT_LT(ratio, 4.0 / 3 * 1.05);
    area_sum += static_cast<double>(b.width) * b.height / (375.0 * 500);
  }
  // Area fractions are uniform in [0.08, 1] when they fit (mean 0.54); large
  // ones with extreme ratios do not fit and are redrawn, which lowers it:
  // torchvision's own get_params gives 0.435 on 375 x 500 (20000 draws,
  // standard error 0.002).
  EXPECT_NEAR(area_sum / n, 0.435, 0.01);
}

TEST(Geometry, RandomResizedCropFallsBackToTheClampedCentre) {
  // 10 x 1000: any area of at least 8% needs a height above 10, so all ten
  // tries fail; the ratio 100 is clamped to 4/3: h = 10, w = round(13.33) = 13.
  SampleRng rng(SampleKey{1, 2, 3}, 0);
  EXPECT_EQ(random_resized_crop_box(10, 1000, {0.08, 1.0}, {3.0 / 4, 4.0 / 3}, rng), (CropBox{0, 493, 10, 13}));
  // Tall: w = 10, h = round(10 / 0.75) = 13.
  SampleRng rng2(SampleKey{1, 2, 3}, 0);
  EXPECT_EQ(random_resized_crop_box(1000, 10, {0.08, 1.0}, {3.0 / 4, 4.0 / 3}, rng2), (CropBox{493, 0, 13, 10}));
}

TEST(Layout, HflipMirrorsAndTwiceIsIdentity) {
  const Image src = make_image(3, 7, 5);
  Image f = src;
  hflip(f);
  for (int y = 0; y < 3; ++y) {
    for (int x = 0; x < 7; ++x) {
      for (int c = 0; c < 3; ++c) ASSERT_EQ(f.pixels[(y * 7 + x) * 3 + c], src.pixels[(y * 7 + 6 - x) * 3 + c]);
    }
  }
  hflip(f);
  EXPECT_EQ(f.pixels, src.pixels);
}

TEST(Layout, ChwOutputsMatchTheFormula) {
  const Image src = make_image(5, 6, 6);
  std::vector<std::uint8_t> u8(90);
  std::vector<float> f32(90);
  to_chw_uint8(src, u8.data());
  const std::array<float, 3> mean{0.485f, 0.456f, 0.406f}, stdev{0.229f, 0.224f, 0.225f};
  to_chw_float(src, mean, stdev, f32.data());
  for (int c = 0; c < 3; ++c) {
    for (int i = 0; i < 30; ++i) {
      const std::uint8_t v = src.pixels[i * 3 + c];
      ASSERT_EQ(u8[c * 30 + i], v);
      // The same float32 steps as torchvision, so equality, not closeness.
      const volatile float scaled = static_cast<float>(v) / 255.0f;
      ASSERT_EQ(f32[c * 30 + i], (scaled - mean[c]) / stdev[c]);
    }
  }
}

TEST(Layout, MirroredChwEqualsHflipThenChw) {
  const std::array<float, 3> mean{0.485f, 0.456f, 0.406f}, stdev{0.229f, 0.224f, 0.225f};
  for (const auto& [h, w] : {std::pair{1, 1}, std::pair{3, 7}, std::pair{5, 8}, std::pair{224, 223}}) {
    const Image src = make_image(h, w, 7);
    Image flipped = src;
    hflip(flipped);
    const std::size_t n = static_cast<std::size_t>(3 * h * w);
    std::vector<std::uint8_t> u8_want(n), u8_got(n);
    std::vector<float> f32_want(n), f32_got(n);
    to_chw_uint8(flipped, u8_want.data());
    to_chw_uint8(src, u8_got.data(), Mirror::kYes);
    EXPECT_EQ(u8_got, u8_want) << h << "x" << w;
    to_chw_float(flipped, mean, stdev, f32_want.data());
    to_chw_float(src, mean, stdev, f32_got.data(), Mirror::kYes);
    EXPECT_EQ(std::memcmp(f32_got.data(), f32_want.data(), n * sizeof(float)), 0) << h << "x" << w;
  }
}

}  // namespace
}  // namespace dlop::media
