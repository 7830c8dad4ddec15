// The image ops, each behaving like its torchvision counterpart on the same
// pixels. All take and produce 8-bit RGB HWC images except the final layout
// step, which writes CHW planes (uint8, or float32 normalised).
#pragma once

#include <array>
#include <cstdint>
#include <utility>

#include "core/random.hpp"
#include "media/image.hpp"

namespace dlop::media {

// A rectangle of an image; it may reach outside (center_crop of a smaller
// image), and what lies outside reads as zeros.
struct CropBox {
  int top = 0;
  int left = 0;
  int height = 0;
  int width = 0;
  bool operator==(const CropBox&) const = default;
};

// torchvision's RandomResizedCrop.get_params: up to 10 tries of an area
// fraction uniform in `scale` and an aspect ratio log-uniform in `ratio`
// (sides rounded half to even, as Python's round), placed uniformly; then the
// centre crop clamped to `ratio`.
CropBox random_resized_crop_box(int height, int width, std::array<double, 2> scale,
                                std::array<double, 2> ratio, SampleRng& rng);

// torchvision's CenterCrop box: offsets int(round((in - out) / 2)).
CropBox center_crop_box(int height, int width, int crop_height, int crop_width);

// torchvision's Resize(size) for one int: the shorter side becomes `size`, the
// longer int(size * long / short); then, when max_size > 0, both are scaled so
// that the longer side is at most max_size. Returns {height, width}.
std::pair<int, int> resize_shorter_side(int height, int width, int size, int max_size = 0);

// Resamples the `box` region of `src` (inside the image) to out_height x
// out_width with the bilinear (triangle) filter, widened by the shrink factor
// when `antialias` is on: PIL's resampling, with its fixed-point weights and
// its order (horizontal pass to 8 bits, then vertical), so results equal
// PIL's and torchvision's on PIL images; torchvision's uint8 tensor kernel is
// within one level. `dst` is reused; it must not be `src`.
void resize(const Image& src, const CropBox& box, int out_height, int out_width, bool antialias,
            Image& dst);
Image resize(const Image& src, int out_height, int out_width, bool antialias = true);

// Copies `box` (zeros where it reaches outside `src`) into `dst`.
void crop(const Image& src, const CropBox& box, Image& dst);

// Mirrors left-right in place.
void hflip(Image& image);

// Whether the layout step mirrors the image left-right as it writes it: the
// same values as hflip then the layout step, in one pass over the pixels.
enum class Mirror { kNo, kYes };

// Writes C planes (CHW) of 8-bit values.
void to_chw_uint8(const Image& image, std::uint8_t* out, Mirror mirror = Mirror::kNo);

// Writes C planes (CHW) of float32 (x / 255 - mean[c]) / std[c], each step in
// float32 as torchvision's ToTensor then Normalize compute it, so results
// are bitwise equal to theirs. mean 0 and std 1 give plain ToTensor.
void to_chw_float(const Image& image, const std::array<float, 3>& mean, const std::array<float, 3>& std,
                  float* out, Mirror mirror = Mirror::kNo);

}  // namespace dlop::media
