// JPEG (libjpeg-turbo) and PNG (libpng) decoding to 8-bit RGB, and the encoders
// the tests and the synthetic dataset use.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string_view>
#include <vector>

#include "media/image.hpp"
#include "media/ops.hpp"

namespace dlop::media {

enum class ImageFormat { kUnknown, kJpeg, kPng };

// Sniffs the magic bytes, not the file name.
ImageFormat detect_format(std::span<const std::uint8_t> bytes);

struct DecodeOptions {
  // PIL.ImageFile.LOAD_TRUNCATED_IMAGES: a JPEG that libjpeg fails on (its
  // data ends early, or is bad past the headers) decodes as PIL then decodes
  // it, pixel for pixel where both are libjpeg-turbo >= 3.0, instead of
  // failing. Headers cut short, and PNGs, still fail.
  bool load_truncated = false;
};

// Decodes a JPEG or PNG into RGB as PIL's `Image.open(f).convert("RGB")` does:
// grayscale is replicated, palettes looked up, alpha and tRNS dropped (not
// composited), 16-bit samples keep their high byte, gamma is not applied.
// JPEGs use libjpeg's defaults (islow DCT, fancy upsampling), as PIL does.
// Throws SampleError naming `name` (a path or record name) and the reason for
// empty, truncated, corrupt or unsupported data. Thread-safe. `out` is reused.
void decode_image(std::span<const std::uint8_t> bytes, std::string_view name, Image& out, DecodeOptions options = {});
Image decode_image(std::span<const std::uint8_t> bytes, std::string_view name, DecodeOptions options = {});

// Picks the region to decode from the image's {height, width}.
using RegionChooser = std::function<CropBox(int height, int width)>;

// Decodes what `choose` asks for: returns where its box lies in `out`, whose
// pixels there equal decode_image's (the tests check it). JPEGs convert only
// those rows and (rounded out to 8 or 16 pixels) columns, so a small crop of
// a large photo decodes faster; PNGs and CMYK JPEGs are decoded whole and the
// box returned as chosen. Errors as decode_image, also for data outside the box.
CropBox decode_image_region(std::span<const std::uint8_t> bytes, std::string_view name, const RegionChooser& choose,
                            Image& out, DecodeOptions options = {});

// Encoders take interleaved 8-bit `pixels` (height * width * channels); the
// raw-pointer forms exist for the tests' gray and RGBA inputs.
// Baseline JPEG, 4:2:0 chroma subsampling for colour, quality 1..100;
// channels 1 (gray) or 3 (RGB).
std::vector<std::uint8_t> encode_jpeg(const std::uint8_t* pixels, int height, int width, int channels,
                                      int quality = 90);
// PNG; channels 1 (gray), 2 (gray + alpha), 3 (RGB) or 4 (RGBA).
std::vector<std::uint8_t> encode_png(const std::uint8_t* pixels, int height, int width, int channels);
inline std::vector<std::uint8_t> encode_jpeg(const Image& image, int quality = 90) {
  return encode_jpeg(image.pixels.data(), image.height, image.width, Image::kChannels, quality);
}
inline std::vector<std::uint8_t> encode_png(const Image& image) {
  return encode_png(image.pixels.data(), image.height, image.width, Image::kChannels);
}

}  // namespace dlop::media
