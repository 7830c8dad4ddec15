// Decoding: round trips through our encoders, colour conversions, and every
// way a file can be bad (empty, truncated, corrupt, not an image).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>

#include "media/codec.hpp"
#include "media/ops.hpp"
#include "test_data.hpp"

namespace dlop::media {
namespace {

using test::make_image;

// Expects a SampleError naming `name` whose reason contains `reason`.
template <typename Fn>
void expect_sample_error(Fn&& fn, const std::string& name, const std::string& reason) {
  try {
    fn();
    ADD_FAILURE() << "no error; expected " << reason;
  } catch (const SampleError& e) {
    EXPECT_EQ(e.sample(), name);
    EXPECT_NE(e.reason().find(reason), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(name), std::string::npos) << e.what();
  }
}

double mean_abs_diff(const Image& a, const Image& b) {
  double total = 0;
  for (std::size_t i = 0; i < a.pixels.size(); ++i) total += std::abs(a.pixels[i] - b.pixels[i]);
  return total / static_cast<double>(a.pixels.size());
}

TEST(Codec, PngRoundTripIsExact) {
  const Image img = make_image(37, 53, 1);
  const auto bytes = encode_png(img);
  EXPECT_EQ(detect_format(bytes), ImageFormat::kPng);
  const Image out = decode_image(bytes, "a.png");
  ASSERT_EQ(out.height, 37);
  ASSERT_EQ(out.width, 53);
  EXPECT_EQ(out.pixels, img.pixels);
}

TEST(Codec, JpegRoundTripIsClose) {
  const Image img = make_image(375, 500, 2);
  const auto bytes = encode_jpeg(img, 95);
  EXPECT_EQ(detect_format(bytes), ImageFormat::kJpeg);
  const Image out = decode_image(bytes, "a.jpg");
  ASSERT_EQ(out.height, 375);
  ASSERT_EQ(out.width, 500);
  // Lossy, and the noise does not survive 4:2:0 chroma exactly; a wrong
  // colour conversion or row stride is off by tens, as another image is.
  EXPECT_LT(mean_abs_diff(out, img), 8.0);
  EXPECT_GT(mean_abs_diff(out, make_image(375, 500, 3)), 15.0);
}

TEST(Codec, GrayAndAlphaBecomeRgbLikePilConvert) {
  const int h = 9, w = 11;
  std::vector<std::uint8_t> gray(h * w), gray_alpha(h * w * 2), rgba(h * w * 4);
  const Image rgb = make_image(h, w, 3);
  for (int i = 0; i < h * w; ++i) {
    gray[i] = static_cast<std::uint8_t>(i * 7);
    gray_alpha[i * 2] = gray[i];
    gray_alpha[i * 2 + 1] = static_cast<std::uint8_t>(i);
    for (int c = 0; c < 3; ++c) rgba[i * 4 + c] = rgb.pixels[i * 3 + c];
    rgba[i * 4 + 3] = static_cast<std::uint8_t>(255 - i);
  }
  const auto check_gray = [&](const Image& out) {
    ASSERT_EQ(out.pixels.size(), static_cast<std::size_t>(h * w * 3));
    for (int i = 0; i < h * w; ++i) {
      for (int c = 0; c < 3; ++c) ASSERT_EQ(out.pixels[i * 3 + c], gray[i]) << i;
    }
  };
  check_gray(decode_image(encode_png(gray.data(), h, w, 1), "g.png"));
  check_gray(decode_image(encode_png(gray_alpha.data(), h, w, 2), "ga.png"));
  // Alpha is dropped, not composited (PIL's convert("RGB")).
  EXPECT_EQ(decode_image(encode_png(rgba.data(), h, w, 4), "rgba.png").pixels, rgb.pixels);
  // A grayscale JPEG decodes to equal channels, close to the input.
  const Image gj = decode_image(encode_jpeg(gray.data(), h, w, 1, 100), "g.jpg");
  for (int i = 0; i < h * w; ++i) {
    EXPECT_EQ(gj.pixels[i * 3], gj.pixels[i * 3 + 1]);
    EXPECT_EQ(gj.pixels[i * 3], gj.pixels[i * 3 + 2]);
  }
}

TEST(Codec, EmptyFileIsASampleError) {
  expect_sample_error([] { decode_image({}, "empty.jpg"); }, "empty.jpg", "empty file");
}

TEST(Codec, TruncatedJpegIsASampleError) {
  const auto bytes = encode_jpeg(make_image(120, 160, 4), 90);
  for (const std::size_t keep : {bytes.size() / 2, bytes.size() * 3 / 4, std::size_t{3}, std::size_t{200}}) {
    const std::span<const std::uint8_t> cut(bytes.data(), keep);
    try {
      decode_image(cut, "cut.jpg");
      ADD_FAILURE() << "kept " << keep << " of " << bytes.size() << " bytes: no error";
    } catch (const SampleError& e) {
      EXPECT_EQ(e.sample(), "cut.jpg");
      // Cut inside the image data: "truncated"; inside the headers libjpeg
      // reports it in its own words.
      if (keep >= bytes.size() / 2) {
        EXPECT_NE(e.reason().find("truncated"), std::string::npos) << e.what();
      }
    }
  }
}

TEST(Codec, JpegMissingOnlyItsEndMarkerIsTruncatedAsForPil) {
  const auto bytes = encode_jpeg(make_image(120, 160, 4), 90);
  expect_sample_error([&] { decode_image(std::span(bytes.data(), bytes.size() - 2), "no-eoi.jpg"); }, "no-eoi.jpg",
                      "truncated");
}

// PIL.ImageFile.LOAD_TRUNCATED_IMAGES: PIL appends an end marker to the data
// it has and keeps what libjpeg makes of that. The Python tests compare with
// PIL itself; here, with that construction and with the intact file.
TEST(Codec, TruncatedJpegLoadsAsPilWithLoadTruncated) {
  const Image img = make_image(120, 160, 4);
  const auto bytes = encode_jpeg(img, 90);
  const Image whole = decode_image(bytes, "whole.jpg");
  const DecodeOptions load{.load_truncated = true};
  for (const std::size_t keep : {bytes.size() / 2, bytes.size() * 3 / 4, bytes.size() - 2}) {
    const std::span<const std::uint8_t> cut(bytes.data(), keep);
    expect_sample_error([&] { decode_image(cut, "cut.jpg"); }, "cut.jpg", "truncated");
    const Image out = decode_image(cut, "cut.jpg", load);
    ASSERT_EQ(out.height, 120);
    ASSERT_EQ(out.width, 160);
    std::vector<std::uint8_t> marked(cut.begin(), cut.end());
    marked.insert(marked.end(), {0xFF, 0xD9});
    EXPECT_EQ(out.pixels, decode_image(marked, "marked.jpg").pixels) << "kept " << keep;
    // The first rows had all their data: they are the intact file's.
    const std::size_t top = out.row_bytes() * 16;
    EXPECT_TRUE(std::equal(out.pixels.begin(), out.pixels.begin() + top, whole.pixels.begin())) << "kept " << keep;
    if (keep < bytes.size() - 2) {
      EXPECT_GT(mean_abs_diff(out, whole), 5.0) << "kept " << keep;  // the rest is made up
    }
    // A region of it is that region of the whole decode, and the box the one chosen.
    Image region;
    const CropBox box{40, 30, 50, 70};
    const CropBox where = decode_image_region(cut, "cut.jpg", [&](int, int) { return box; }, region, load);
    Image a, b;
    crop(out, box, a);
    crop(region, where, b);
    EXPECT_EQ(a.pixels, b.pixels) << "kept " << keep;
  }
  // Without headers there is no image to fill in.
  expect_sample_error([&] { decode_image(std::span(bytes.data(), 200), "head.jpg", load); }, "head.jpg", "JPEG");
}

TEST(Codec, TruncatedPngIsASampleError) {
  const auto bytes = encode_png(make_image(64, 64, 5));
  for (const std::size_t keep : {bytes.size() / 2, std::size_t{20}, std::size_t{8}}) {
    expect_sample_error([&] { decode_image(std::span(bytes.data(), keep), "cut.png"); }, "cut.png", "truncated");
  }
}

TEST(Codec, CorruptJpegIsASampleError) {
  auto bytes = encode_jpeg(make_image(64, 64, 6), 90);
  // Overwrite the headers after SOI: no valid marker follows.
  for (std::size_t i = 3; i < 40; ++i) bytes[i] = 0x00;
  expect_sample_error([&] { decode_image(bytes, "bad.jpg"); }, "bad.jpg", "corrupt JPEG");
}

TEST(Codec, CorruptPngIsASampleError) {
  auto bytes = encode_png(make_image(32, 32, 7));
  bytes[20] ^= 0xFF;  // inside IHDR: its CRC no longer matches
  expect_sample_error([&] { decode_image(bytes, "bad.png"); }, "bad.png", "corrupt PNG");
}

TEST(Codec, UnknownFormatIsASampleError) {
  const std::vector<std::uint8_t> gif{'G', 'I', 'F', '8', '9', 'a', 0, 0};
  expect_sample_error([&] { decode_image(gif, "x.gif"); }, "x.gif", "not a JPEG or PNG (starts with 47 49 46 38)");
}

TEST(Codec, RandomBytesAfterAValidMagicNeverCrash) {
  std::mt19937 rng(8);
  const auto jpeg = encode_jpeg(make_image(40, 48, 8), 80);
  const auto png = encode_png(make_image(40, 48, 8));
  int errors = 0;
  for (int round = 0; round < 300; ++round) {
    auto bytes = round % 2 ? jpeg : png;
    for (int k = 0; k < 1 + round % 7; ++k) bytes[rng() % bytes.size()] = static_cast<std::uint8_t>(rng());
    try {
      const Image out = decode_image(bytes, "fuzz");
      EXPECT_EQ(out.pixels.size(), out.row_bytes() * static_cast<std::size_t>(out.height));
    } catch (const SampleError&) {
      ++errors;
    }
  }
  EXPECT_GT(errors, 0);
}

TEST(Codec, RegionDecodeEqualsTheSameBoxOfAFullDecode) {
  std::mt19937 rng(9);
  const Image img = make_image(203, 317, 9);
  std::vector<std::vector<std::uint8_t>> files;
  files.push_back(encode_jpeg(img, 90));  // 4:2:0, fancy upsampling across iMCU rows
  std::vector<std::uint8_t> gray(203 * 317);
  for (std::size_t i = 0; i < gray.size(); ++i) gray[i] = img.pixels[i * 3 + 1];
  files.push_back(encode_jpeg(gray.data(), 203, 317, 1, 90));
  files.push_back(encode_png(img));
  for (const auto& file : files) {
    const Image full = decode_image(file, "full");
    for (int round = 0; round < 60; ++round) {
      const int h = 1 + static_cast<int>(rng() % 203), w = 1 + static_cast<int>(rng() % 317);
      const CropBox want{static_cast<int>(rng() % static_cast<unsigned>(204 - h)),
                         static_cast<int>(rng() % static_cast<unsigned>(318 - w)), h, w};
      Image region;
      const CropBox where = decode_image_region(file, "region", [&](int ih, int iw) {
        EXPECT_EQ(ih, 203);
        EXPECT_EQ(iw, 317);
        return want;
      }, region);
      ASSERT_EQ(where.height, h);
      ASSERT_EQ(where.width, w);
      Image a, b;
      crop(full, want, a);
      crop(region, where, b);
      ASSERT_EQ(a.pixels, b.pixels) << "box " << want.top << "," << want.left << " " << h << "x" << w;
    }
  }
}

TEST(Codec, RegionDecodeStillFindsTruncationBelowTheBox) {
  const auto bytes = encode_jpeg(make_image(256, 256, 10), 90);
  const std::span<const std::uint8_t> cut(bytes.data(), bytes.size() * 3 / 4);
  Image out;
  expect_sample_error([&] { decode_image_region(cut, "cut.jpg", [](int, int) { return CropBox{0, 0, 16, 16}; }, out); },
                      "cut.jpg", "truncated");
}

}  // namespace
}  // namespace dlop::media
