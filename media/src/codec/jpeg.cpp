// JPEG through libjpeg-turbo's libjpeg API. libjpeg reports fatal errors by
// calling error_exit, which must not return: we longjmp back to the frame
// that called setjmp. Only trivially destructible objects live in that frame
// and in the libjpeg frames it skips, so no destructor is jumped over; the
// caller owns the output buffer and frees libjpeg's state after the jump.
#include <algorithm>
#include <csetjmp>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <vector>
// jpeglib.h needs FILE and size_t declared first.
#include <jerror.h>
#include <jpeglib.h>

#include <fmt/format.h>

#include "codec_detail.hpp"

namespace dlop::media {
namespace {

constexpr const char* kTruncated = "truncated JPEG: data ends before the image does";

struct ErrorManager {
  jpeg_error_mgr pub;  // first, so libjpeg's pointer to it is ours too
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
  bool truncated;
};

[[noreturn]] void on_error(j_common_ptr cinfo) {
  auto* err = reinterpret_cast<ErrorManager*>(cinfo->err);
  (*cinfo->err->format_message)(cinfo, err->message);
  std::longjmp(err->jump, 1);
}

// libjpeg turns running out of data into a warning and fills the rest of the
// image with gray; PIL raises "image file is truncated" instead, and so do we.
// Other warnings (e.g. extraneous bytes before a marker) are ignored, as PIL does.
void on_message(j_common_ptr cinfo, int level) {
  auto* err = reinterpret_cast<ErrorManager*>(cinfo->err);
  if (level < 0 && cinfo->err->msg_code == JWRN_JPEG_EOF) err->truncated = true;
}

std::uint8_t muldiv255(unsigned a, unsigned b) {
  const unsigned t = a * b + 128;
  return static_cast<std::uint8_t>((t + (t >> 8)) >> 8);
}

// libjpeg's state lives in the caller's frame: objects changed between
// setjmp and longjmp must not be locals of the frame that calls setjmp.
struct Decoder {
  jpeg_decompress_struct cinfo;
  ErrorManager err;
};

struct Encoder {
  jpeg_compress_struct cinfo;
  ErrorManager err;
  unsigned char* buffer = nullptr;
  unsigned long size = 0;
};

// Leaves `reason` empty on success, else writes why it failed.
// With `choose`, only the rows of the box it picks are converted (columns
// rounded out to whole iMCUs by libjpeg-turbo's jpeg_crop_scanline): the rows
// above are skipped, those below entropy-decoded only (so truncation is still
// found); `where` gets the box's place in `out`.
void decode_impl(Decoder& d, const std::uint8_t* data, std::size_t size, Image& out, const RegionChooser* choose,
                 CropBox* where, char* reason, std::size_t reason_size) {
  jpeg_decompress_struct& cinfo = d.cinfo;
  ErrorManager& err = d.err;
  cinfo.err = jpeg_std_error(&err.pub);
  err.pub.error_exit = on_error;
  err.pub.emit_message = on_message;
  err.truncated = false;
  err.message[0] = '\0';
  reason[0] = '\0';
  if (setjmp(err.jump)) {
    std::snprintf(reason, reason_size, "%s", err.message);
    jpeg_destroy_decompress(&cinfo);
    return;
  }
  jpeg_create_decompress(&cinfo);
  jpeg_mem_src(&cinfo, data, static_cast<unsigned long>(size));
  jpeg_read_header(&cinfo, TRUE);
  if (static_cast<std::uint64_t>(cinfo.image_width) * cinfo.image_height > detail::kMaxPixels) {
    std::snprintf(reason, reason_size, "image too large: %ux%u is more than 178956970 pixels", cinfo.image_width,
                  cinfo.image_height);
    jpeg_destroy_decompress(&cinfo);
    return;
  }
  const bool cmyk = cinfo.jpeg_color_space == JCS_CMYK || cinfo.jpeg_color_space == JCS_YCCK;
  // libjpeg converts gray and YCbCr to RGB itself; CMYK it only passes through.
  cinfo.out_color_space = cmyk ? JCS_CMYK : JCS_RGB;
  jpeg_start_decompress(&cinfo);
  const int channels = cinfo.output_components;
  if (choose != nullptr) {
    const CropBox box = (*choose)(static_cast<int>(cinfo.output_height), static_cast<int>(cinfo.output_width));
    *where = box;
    if (!cmyk && box.top >= 0 && box.left >= 0 && box.height > 0 && box.width > 0 &&
        static_cast<JDIMENSION>(box.top + box.height) <= cinfo.output_height &&
        static_cast<JDIMENSION>(box.left + box.width) <= cinfo.output_width) {
      // Fancy upsampling reads the chroma samples beside a pixel, and at the
      // edge of a cropped scanline it has none: so the crop gets a margin of
      // at least one pixel on each side (before rounding out to iMCUs),
      // unless it already touches the image's edge, as a full decode does.
      const int x0 = std::max(box.left - 2, 0);
      const int x1 = std::min(box.left + box.width + 2, static_cast<int>(cinfo.output_width));
      JDIMENSION x = static_cast<JDIMENSION>(x0);
      JDIMENSION w = static_cast<JDIMENSION>(x1 - x0);
      if (w < cinfo.output_width) jpeg_crop_scanline(&cinfo, &x, &w);
      out.reshape(box.height, static_cast<int>(cinfo.output_width));
      where->top = 0;
      where->left = box.left - static_cast<int>(x);
      if (box.top > 0) jpeg_skip_scanlines(&cinfo, static_cast<JDIMENSION>(box.top));
      for (int y = 0; y < box.height; ++y) {
        JSAMPROW row = out.pixels.data() + static_cast<std::size_t>(y) * out.row_bytes();
        jpeg_read_scanlines(&cinfo, &row, 1);
      }
      // The rows below are still read, so a file cut short anywhere fails as
      // it would in a full decode: skipping rows decodes their entropy-coded
      // data only, but skipping to the very end reads nothing, hence the
      // last row is read for real.
      const JDIMENSION rest = cinfo.output_height - cinfo.output_scanline;
      if (rest > 1) jpeg_skip_scanlines(&cinfo, rest - 1);
      if (rest > 0) {
        JSAMPARRAY last = (*cinfo.mem->alloc_sarray)(reinterpret_cast<j_common_ptr>(&cinfo), JPOOL_IMAGE,
                                                     cinfo.output_width * 3, 1);
        jpeg_read_scanlines(&cinfo, last, 1);
      }
      if (!err.truncated) jpeg_finish_decompress(&cinfo);
      if (err.truncated) {
        std::snprintf(reason, reason_size, "%s", kTruncated);
      }
      jpeg_destroy_decompress(&cinfo);
      return;
    }
  }
  out.reshape(static_cast<int>(cinfo.output_height), static_cast<int>(cinfo.output_width));
  if (!cmyk) {
    while (cinfo.output_scanline < cinfo.output_height) {
      JSAMPROW row = out.pixels.data() + cinfo.output_scanline * out.row_bytes();
      jpeg_read_scanlines(&cinfo, &row, 1);
    }
  } else {
    // Adobe's CMYK JPEGs store inverted inks, so a stored value is the
    // fraction of light kept: R = C' * K' / 255, as PIL converts.
    JSAMPARRAY rows = (*cinfo.mem->alloc_sarray)(reinterpret_cast<j_common_ptr>(&cinfo), JPOOL_IMAGE,
                                                 cinfo.output_width * static_cast<unsigned>(channels), 1);
    const bool inverted = cinfo.saw_Adobe_marker;
    while (cinfo.output_scanline < cinfo.output_height) {
      std::uint8_t* dst = out.pixels.data() + cinfo.output_scanline * out.row_bytes();
      jpeg_read_scanlines(&cinfo, rows, 1);
      for (unsigned x = 0; x < cinfo.output_width; ++x) {
        const std::uint8_t* p = rows[0] + x * 4;
        const unsigned k = inverted ? p[3] : 255u - p[3];
        for (int c = 0; c < 3; ++c) dst[x * 3 + c] = muldiv255(inverted ? p[c] : 255u - p[c], k);
      }
    }
  }
  if (err.truncated) {
    std::snprintf(reason, reason_size, "%s", kTruncated);
    jpeg_destroy_decompress(&cinfo);
    return;
  }
  jpeg_finish_decompress(&cinfo);
  jpeg_destroy_decompress(&cinfo);
}

// PIL.ImageFile.LOAD_TRUNCATED_IMAGES: PIL feeds libjpeg through a
// suspending source, appends an end marker when the file runs out, and keeps
// what libjpeg made of that: rows it could not make stay as PIL's new image
// holds them (zero; white once CMYK is converted), and an error past the
// headers is not raised. Here the same, over `data` (the file and FF D9).
struct SuspendingSource {
  jpeg_source_mgr pub;  // first, so libjpeg's pointer to it is ours too
};

void no_op(j_decompress_ptr) {}
boolean suspend(j_decompress_ptr) { return FALSE; }  // no more data will come
void skip_data(j_decompress_ptr cinfo, long count) {
  jpeg_source_mgr* src = cinfo->src;
  const std::size_t n = std::min(static_cast<std::size_t>(std::max(count, 0L)), src->bytes_in_buffer);
  src->next_input_byte += n;
  src->bytes_in_buffer -= n;
}

struct PilDecoder {
  jpeg_decompress_struct cinfo;
  ErrorManager err;
  SuspendingSource source;
  bool started;  // past the headers: an error from here on keeps the rows made
};

void decode_as_pil(PilDecoder& d, const std::uint8_t* data, std::size_t size, Image& out, char* reason,
                   std::size_t reason_size) {
  jpeg_decompress_struct& cinfo = d.cinfo;
  cinfo.err = jpeg_std_error(&d.err.pub);
  d.err.pub.error_exit = on_error;
  d.err.pub.emit_message = on_message;
  d.err.message[0] = '\0';
  d.started = false;
  reason[0] = '\0';
  if (setjmp(d.err.jump)) {
    if (!d.started) std::snprintf(reason, reason_size, "%s", d.err.message);
    jpeg_destroy_decompress(&cinfo);
    return;
  }
  jpeg_create_decompress(&cinfo);
  d.source.pub = {data, size, no_op, suspend, skip_data, jpeg_resync_to_restart, no_op};
  cinfo.src = &d.source.pub;
  if (jpeg_read_header(&cinfo, TRUE) != JPEG_HEADER_OK) {
    std::snprintf(reason, reason_size, "%s", kTruncated);
    jpeg_destroy_decompress(&cinfo);
    return;
  }
  if (static_cast<std::uint64_t>(cinfo.image_width) * cinfo.image_height > detail::kMaxPixels) {
    std::snprintf(reason, reason_size, "image too large: %ux%u is more than 178956970 pixels", cinfo.image_width,
                  cinfo.image_height);
    jpeg_destroy_decompress(&cinfo);
    return;
  }
  const bool cmyk = cinfo.jpeg_color_space == JCS_CMYK || cinfo.jpeg_color_space == JCS_YCCK;
  cinfo.out_color_space = cmyk ? JCS_CMYK : JCS_RGB;
  out.reshape(static_cast<int>(cinfo.image_height), static_cast<int>(cinfo.image_width));
  std::fill(out.pixels.begin(), out.pixels.end(), cmyk ? 255 : 0);
  d.started = true;
  if (!jpeg_start_decompress(&cinfo)) {  // a progressive file's scans did not all arrive
    jpeg_destroy_decompress(&cinfo);
    return;
  }
  JSAMPARRAY cmyk_row = cmyk ? (*cinfo.mem->alloc_sarray)(reinterpret_cast<j_common_ptr>(&cinfo), JPOOL_IMAGE,
                                                          cinfo.output_width * 4, 1)
                             : nullptr;
  const bool inverted = cinfo.saw_Adobe_marker;
  while (cinfo.output_scanline < cinfo.output_height) {
    std::uint8_t* dst = out.pixels.data() + cinfo.output_scanline * out.row_bytes();
    JSAMPROW row = dst;
    if (jpeg_read_scanlines(&cinfo, cmyk ? cmyk_row : &row, 1) != 1) break;
    for (unsigned x = 0; cmyk && x < cinfo.output_width; ++x) {
      const std::uint8_t* p = cmyk_row[0] + x * 4;
      const unsigned k = inverted ? p[3] : 255u - p[3];
      for (int c = 0; c < 3; ++c) dst[x * 3 + c] = muldiv255(inverted ? p[c] : 255u - p[c], k);
    }
  }
  jpeg_destroy_decompress(&cinfo);
}

// Encoding only sees well-formed images, so an error here is a bug in the
// caller's arguments; it comes back as false with the message in err.
bool encode_impl(Encoder& e, const std::uint8_t* pixels, int height, int width, int channels,
                 int quality) {
  jpeg_compress_struct& cinfo = e.cinfo;
  cinfo.err = jpeg_std_error(&e.err.pub);
  e.err.pub.error_exit = on_error;
  e.err.message[0] = '\0';
  if (setjmp(e.err.jump)) {
    jpeg_destroy_compress(&cinfo);
    return false;
  }
  jpeg_create_compress(&cinfo);
  jpeg_mem_dest(&cinfo, &e.buffer, &e.size);
  cinfo.image_width = static_cast<JDIMENSION>(width);
  cinfo.image_height = static_cast<JDIMENSION>(height);
  cinfo.input_components = channels;
  cinfo.in_color_space = channels == 1 ? JCS_GRAYSCALE : JCS_RGB;
  jpeg_set_defaults(&cinfo);
  jpeg_set_quality(&cinfo, quality, TRUE);
  jpeg_start_compress(&cinfo, TRUE);
  const std::size_t stride = static_cast<std::size_t>(width) * static_cast<std::size_t>(channels);
  while (cinfo.next_scanline < cinfo.image_height) {
    JSAMPROW row = const_cast<std::uint8_t*>(pixels) + cinfo.next_scanline * stride;
    jpeg_write_scanlines(&cinfo, &row, 1);
  }
  jpeg_finish_compress(&cinfo);
  jpeg_destroy_compress(&cinfo);
  return true;
}

}  // namespace

void detail::decode_jpeg(std::span<const std::uint8_t> bytes, std::string_view name, Image& out,
                         DecodeOptions options, const RegionChooser* choose, CropBox* where) {
  char reason[JMSG_LENGTH_MAX + 64];
  std::optional<CropBox> chosen;
  const RegionChooser remember = [&](int h, int w) { return *(chosen = (*choose)(h, w)); };
  {
    Decoder d;
    decode_impl(d, bytes.data(), bytes.size(), out, choose != nullptr ? &remember : nullptr, where, reason,
                sizeof reason);
  }
  // Only a file libjpeg's own way fails is decoded again, PIL's way (which
  // decodes whole: a region decode skips rows); a box already drawn stays.
  if (reason[0] != '\0' && options.load_truncated && std::strncmp(reason, "image too large", 15) != 0) {
    std::vector<std::uint8_t> ended(bytes.begin(), bytes.end());
    ended.insert(ended.end(), {0xFF, JPEG_EOI});
    PilDecoder d;
    char again[sizeof reason];
    decode_as_pil(d, ended.data(), ended.size(), out, again, sizeof again);
    if (again[0] == '\0') {
      reason[0] = '\0';
      if (choose != nullptr) *where = chosen ? *chosen : (*choose)(out.height, out.width);
    }
  }
  if (reason[0] != '\0') {
    out.reshape(0, 0);
    const bool ours = std::strncmp(reason, "truncated", 9) == 0 || std::strncmp(reason, "image too large", 15) == 0;
    throw SampleError(std::string(name), ours ? std::string(reason) : fmt::format("corrupt JPEG: {}", reason));
  }
}

std::vector<std::uint8_t> encode_jpeg(const std::uint8_t* pixels, int height, int width, int channels,
                                      int quality) {
  if (channels != 1 && channels != 3) throw_error(Errc::kInvalidArgument, "encode_jpeg: channels must be 1 or 3");
  if (height <= 0 || width <= 0) throw_error(Errc::kInvalidArgument, "encode_jpeg: empty image");
  Encoder e;
  const bool ok = encode_impl(e, pixels, height, width, channels, quality);
  std::vector<std::uint8_t> result;
  if (ok) result.assign(e.buffer, e.buffer + e.size);
  std::free(e.buffer);
  if (!ok) throw_error(Errc::kInvalidArgument, fmt::format("encode_jpeg: {}", e.err.message));
  return result;
}

}  // namespace dlop::media
