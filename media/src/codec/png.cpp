// PNG through libpng. Like libjpeg, libpng reports errors by longjmp; the
// same rule holds: the state touched between setjmp and longjmp lives in the
// caller's frame, and no object with a destructor is jumped over.
#include <png.h>

#include <fmt/format.h>

#include <csetjmp>
#include <cstdio>
#include <cstring>
#include <vector>

#include "codec_detail.hpp"

namespace dlop::media {
namespace {

struct Reader {
  const std::uint8_t* data = nullptr;
  std::size_t size = 0;
  std::size_t pos = 0;
  char message[256] = {};
  png_structp png = nullptr;
  png_infop info = nullptr;
  std::vector<png_bytep> rows;  // sized before setjmp's frame can jump
};

[[noreturn]] void on_error(png_structp png, png_const_charp message) {
  auto* r = static_cast<Reader*>(png_get_error_ptr(png));
  std::snprintf(r->message, sizeof r->message, "%s", message);
  png_longjmp(png, 1);
}

// Ancillary-chunk problems are warnings: PIL ignores them too.
void on_warning(png_structp, png_const_charp) {}

void read_bytes(png_structp png, png_bytep out, png_size_t length) {
  auto* r = static_cast<Reader*>(png_get_io_ptr(png));
  if (length > r->size - r->pos) png_error(png, "truncated PNG: data ends before the image does");
  std::memcpy(out, r->data + r->pos, length);
  r->pos += length;
}

// Reads the header and sets up the conversion to 8-bit RGB (PIL's
// convert("RGB"): gray replicated, palette looked up, alpha dropped).
bool read_header(Reader& r, Image& out) {
  if (setjmp(png_jmpbuf(r.png))) return false;
  png_set_read_fn(r.png, &r, read_bytes);
  png_read_info(r.png, r.info);
  const png_byte color = png_get_color_type(r.png, r.info);
  const png_byte depth = png_get_bit_depth(r.png, r.info);
  if (color == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(r.png);
  if ((color & PNG_COLOR_MASK_COLOR) == 0) {
    if (depth < 8) png_set_expand_gray_1_2_4_to_8(r.png);
    png_set_gray_to_rgb(r.png);
  }
  if (depth == 16) png_set_strip_16(r.png);
  // palette_to_rgb also turns tRNS into an alpha channel; strip it with the rest.
  png_set_strip_alpha(r.png);
  png_set_interlace_handling(r.png);
  png_read_update_info(r.png, r.info);
  if (png_get_rowbytes(r.png, r.info) != static_cast<png_size_t>(png_get_image_width(r.png, r.info)) * 3) {
    png_error(r.png, "unsupported PNG layout after conversion to RGB");
  }
  const auto width = png_get_image_width(r.png, r.info);
  const auto height = png_get_image_height(r.png, r.info);
  if (static_cast<std::uint64_t>(width) * height > detail::kMaxPixels) {
    png_error(r.png, "image too large: more than 178956970 pixels");
  }
  out.reshape(static_cast<int>(height), static_cast<int>(width));
  return true;
}

bool read_pixels(Reader& r) {
  if (setjmp(png_jmpbuf(r.png))) return false;
  png_read_image(r.png, r.rows.data());
  return true;
}

struct Writer {
  std::vector<std::uint8_t>* out = nullptr;
  char message[256] = {};
  png_structp png = nullptr;
  png_infop info = nullptr;
};

void write_bytes(png_structp png, png_bytep data, png_size_t length) {
  auto* w = static_cast<Writer*>(png_get_io_ptr(png));
  w->out->insert(w->out->end(), data, data + length);
}

[[noreturn]] void on_write_error(png_structp png, png_const_charp message) {
  auto* w = static_cast<Writer*>(png_get_error_ptr(png));
  std::snprintf(w->message, sizeof w->message, "%s", message);
  png_longjmp(png, 1);
}

bool write_impl(Writer& w, png_bytepp rows, int height, int width, int channels) {
  if (setjmp(png_jmpbuf(w.png))) return false;
  static constexpr int kColor[] = {0, PNG_COLOR_TYPE_GRAY, PNG_COLOR_TYPE_GRAY_ALPHA, PNG_COLOR_TYPE_RGB,
                                   PNG_COLOR_TYPE_RGB_ALPHA};
  png_set_write_fn(w.png, &w, write_bytes, nullptr);
  png_set_IHDR(w.png, w.info, static_cast<png_uint_32>(width), static_cast<png_uint_32>(height), 8,
               kColor[channels], PNG_INTERLACE_NONE, PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
  png_write_info(w.png, w.info);
  png_write_image(w.png, rows);
  png_write_end(w.png, nullptr);
  return true;
}

}  // namespace

void detail::decode_png(std::span<const std::uint8_t> bytes, std::string_view name, Image& out) {
  Reader r;
  r.data = bytes.data();
  r.size = bytes.size();
  r.png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &r, on_error, on_warning);
  if (r.png != nullptr) r.info = png_create_info_struct(r.png);
  if (r.info == nullptr) {
    png_destroy_read_struct(&r.png, nullptr, nullptr);
    throw SampleError(std::string(name), "out of memory creating the PNG decoder");
  }
  bool ok = read_header(r, out);
  if (ok) {
    r.rows.resize(static_cast<std::size_t>(out.height));
    for (int y = 0; y < out.height; ++y) r.rows[static_cast<std::size_t>(y)] = out.pixels.data() + y * out.row_bytes();
    ok = read_pixels(r);
  }
  png_destroy_read_struct(&r.png, &r.info, nullptr);
  if (!ok) {
    out.reshape(0, 0);
    // libpng's own wording for a cut-off stream is terse; keep ours when it is ours.
    const bool ours = std::strncmp(r.message, "truncated", 9) == 0 || std::strncmp(r.message, "image too large", 15) == 0;
    throw SampleError(std::string(name), ours ? std::string(r.message) : fmt::format("corrupt PNG: {}", r.message));
  }
}

std::vector<std::uint8_t> encode_png(const std::uint8_t* pixels, int height, int width, int channels) {
  if (channels < 1 || channels > 4) throw_error(Errc::kInvalidArgument, "encode_png: channels must be 1 to 4");
  if (height <= 0 || width <= 0) throw_error(Errc::kInvalidArgument, "encode_png: empty image");
  std::vector<std::uint8_t> result;
  Writer w;
  w.out = &result;
  w.png = png_create_write_struct(PNG_LIBPNG_VER_STRING, &w, on_write_error, on_warning);
  if (w.png != nullptr) w.info = png_create_info_struct(w.png);
  std::vector<png_bytep> rows(static_cast<std::size_t>(height));
  const std::size_t stride = static_cast<std::size_t>(width) * static_cast<std::size_t>(channels);
  for (int y = 0; y < height; ++y) rows[static_cast<std::size_t>(y)] = const_cast<png_bytep>(pixels) + y * stride;
  const bool ok = w.info != nullptr && write_impl(w, rows.data(), height, width, channels);
  png_destroy_write_struct(&w.png, &w.info);
  if (!ok) throw_error(Errc::kInvalidArgument, fmt::format("encode_png: {}", w.message));
  return result;
}

}  // namespace dlop::media
