#include <fmt/format.h>

#include <array>
#include <cstring>

#include "codec_detail.hpp"
#include "media/codec.hpp"

namespace dlop::media {

SampleError::SampleError(std::string sample, std::string reason)
    : Error(Errc::kInvalidArgument, fmt::format("sample {}: {}", sample.empty() ? "<unnamed>" : sample, reason)),
      sample_(std::move(sample)),
      reason_(std::move(reason)) {}

ImageFormat detect_format(std::span<const std::uint8_t> bytes) {
  static constexpr std::array<std::uint8_t, 3> kJpeg{0xFF, 0xD8, 0xFF};
  static constexpr std::array<std::uint8_t, 8> kPng{0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};
  if (bytes.size() >= kJpeg.size() && std::memcmp(bytes.data(), kJpeg.data(), kJpeg.size()) == 0) {
    return ImageFormat::kJpeg;
  }
  if (bytes.size() >= kPng.size() && std::memcmp(bytes.data(), kPng.data(), kPng.size()) == 0) {
    return ImageFormat::kPng;
  }
  return ImageFormat::kUnknown;
}

void decode_image(std::span<const std::uint8_t> bytes, std::string_view name, Image& out, DecodeOptions options) {
  if (bytes.empty()) throw SampleError(std::string(name), "empty file (0 bytes)");
  switch (detect_format(bytes)) {
    case ImageFormat::kJpeg: return detail::decode_jpeg(bytes, name, out, options);
    case ImageFormat::kPng: return detail::decode_png(bytes, name, out);
    case ImageFormat::kUnknown: break;
  }
  std::string head;
  for (std::size_t i = 0; i < std::min<std::size_t>(bytes.size(), 4); ++i) {
    head += fmt::format("{}{:02x}", i ? " " : "", bytes[i]);
  }
  throw SampleError(std::string(name), fmt::format("not a JPEG or PNG (starts with {})", head));
}

CropBox decode_image_region(std::span<const std::uint8_t> bytes, std::string_view name, const RegionChooser& choose,
                            Image& out, DecodeOptions options) {
  if (!bytes.empty() && detect_format(bytes) == ImageFormat::kJpeg) {
    CropBox where;
    detail::decode_jpeg(bytes, name, out, options, &choose, &where);
    return where;
  }
  decode_image(bytes, name, out, options);
  return choose(out.height, out.width);
}

Image decode_image(std::span<const std::uint8_t> bytes, std::string_view name, DecodeOptions options) {
  Image out;
  decode_image(bytes, name, out, options);
  return out;
}

}  // namespace dlop::media
