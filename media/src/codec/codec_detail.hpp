// The per-format decoders behind decode_image.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>

#include "media/codec.hpp"

namespace dlop::media::detail {

// PIL's decompression-bomb limit (twice its warning threshold): a header
// claiming more is refused before anything is allocated.
inline constexpr std::uint64_t kMaxPixels = 178956970;

// `choose` may be null (whole image); see decode_image_region.
void decode_jpeg(std::span<const std::uint8_t> bytes, std::string_view name, Image& out, DecodeOptions options,
                 const RegionChooser* choose = nullptr, CropBox* where = nullptr);
void decode_png(std::span<const std::uint8_t> bytes, std::string_view name, Image& out);

}  // namespace dlop::media::detail
