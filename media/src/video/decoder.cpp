// Exact decoding of chosen frames: wanted frames are served in order, each
// run of them from the keyframe at or before its first frame, matching
// decoded frames to the index by timestamp. A file whose seeks land wrong is
// decoded from its start instead.
extern "C" {
#include <libavutil/pixdesc.h>
#include <libswscale/swscale.h>
}

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <optional>

#include "av_input.hpp"
#include "media/video.hpp"

namespace dlop::media {
namespace {

using detail::AvInput;

struct SwsDeleter {
  void operator()(SwsContext* s) const { sws_freeContext(s); }
};

// Frames to RGB24 as ffmpeg's scale filter converts them, with the frame's
// own matrix and range: exact (-sws_flags bicubic+bitexact+accurate_rnd: C
// arithmetic, the same on every CPU) or swscale's default (SIMD).
class RgbConverter {
 public:
  explicit RgbConverter(bool exact) : flags_(exact ? SWS_BICUBIC | SWS_BITEXACT | SWS_ACCURATE_RND : SWS_BICUBIC) {}
  void convert(const AVFrame& frame, Image& out, const AvInput& input) {
    const int kFlags = flags_;
    const auto format = static_cast<AVPixelFormat>(frame.format);
    sws_.reset(sws_getCachedContext(sws_.release(), frame.width, frame.height, format, frame.width, frame.height,
                                    AV_PIX_FMT_RGB24, kFlags, nullptr, nullptr, nullptr));
    if (!sws_) input.fail(fmt::format("cannot convert {} frames to RGB", av_get_pix_fmt_name(format)));
    const int* coefficients = sws_getCoefficients(frame.colorspace);
    const int full_range = frame.color_range == AVCOL_RANGE_JPEG ? 1 : 0;
    sws_setColorspaceDetails(sws_.get(), coefficients, full_range, sws_getCoefficients(SWS_CS_DEFAULT), 0, 0, 1 << 16,
                             1 << 16);
    // swscale's row writers may store a little past a row's end: rows go to
    // a padded buffer first.
    const int stride = (frame.width * 3 + 63) / 64 * 64;
    padded_.resize(static_cast<std::size_t>(stride) * (frame.height + 1));
    std::uint8_t* dst[4] = {padded_.data(), nullptr, nullptr, nullptr};
    const int dst_stride[4] = {stride, 0, 0, 0};
    if (sws_scale(sws_.get(), frame.data, frame.linesize, 0, frame.height, dst, dst_stride) != frame.height) {
      input.fail("converting a frame to RGB failed");
    }
    out.reshape(frame.height, frame.width);
    for (int y = 0; y < frame.height; ++y) {
      std::memcpy(out.pixels.data() + static_cast<std::size_t>(y) * out.row_bytes(),
                  padded_.data() + static_cast<std::size_t>(y) * stride, out.row_bytes());
    }
  }

 private:
  int flags_;
  std::unique_ptr<SwsContext, SwsDeleter> sws_;
  std::vector<std::uint8_t> padded_;
};

// One pass of demuxing and decoding, restartable from a keyframe or from the
// start of the file.
class FrameReader {
 public:
  // `wanted_pts`: ascending; frames with other timestamps that no frame
  // references are not decoded.
  FrameReader(std::span<const std::uint8_t> bytes, const FrameIndex& index, std::vector<std::int64_t> wanted_pts,
              std::string_view name)
      : bytes_(bytes), index_(index), wanted_pts_(std::move(wanted_pts)), name_(name) {
    open();
  }

  // Starts decoding at the keyframe at position `key` (false when the
  // container refuses the seek).
  bool seek(std::size_t key) {
    if (index_.decode_order) return false;
    const int rc = av_seek_frame(input_->format(), input_->stream_index(), index_.pts[key], AVSEEK_FLAG_BACKWARD);
    if (rc < 0) return false;
    avcodec_flush_buffers(codec_.get());
    draining_ = false;
    decoded_.reset();
    return true;
  }

  // Reopens the file: decoding starts at its first packet.
  void restart() { open(); }

  // The next decoded frame into frame_; false at the end of the stream.
  bool next() {
    for (;;) {
      const int rc = avcodec_receive_frame(codec_.get(), frame_.get());
      if (rc == 0) {
        if (decoded_) ++*decoded_;
        return true;
      }
      if (rc == AVERROR_EOF) return false;
      if (rc != AVERROR(EAGAIN)) input_->fail(fmt::format("decoding failed: {}", detail::av_error(rc)));
      if (input_->read_video_packet(packet_.get())) {
        // A frame no wanted frame is and no other frame references needs no
        // decoding (B-frames mostly, before and between wanted frames). Left
        // alone where frames are counted, as a skipped frame has no output.
        if (!index_.decode_order && packet_->pts != AV_NOPTS_VALUE) {
          codec_->skip_frame =
              std::binary_search(wanted_pts_.begin(), wanted_pts_.end(), packet_->pts) ? AVDISCARD_DEFAULT
                                                                                       : AVDISCARD_NONREF;
        }
        const int sent = avcodec_send_packet(codec_.get(), packet_.get());
        av_packet_unref(packet_.get());
        if (sent < 0 && sent != AVERROR(EAGAIN)) {
          input_->fail(fmt::format("decoding failed: {}", detail::av_error(sent)));
        }
      } else if (!draining_) {
        draining_ = true;
        avcodec_send_packet(codec_.get(), nullptr);
      }
    }
  }

  const AVFrame& frame() const { return *frame_; }
  std::int64_t timestamp() const { return frame_->best_effort_timestamp; }
  const AvInput& input() const { return *input_; }
  // The position of the frame just decoded by its count from the first
  // frame; none after a seek.
  std::optional<std::size_t> count() const {
    return decoded_ && *decoded_ > 0 ? std::optional<std::size_t>(*decoded_ - 1) : std::nullopt;
  }

 private:
  void open() {
    codec_.reset();
    input_ = std::make_unique<AvInput>(bytes_, name_);
    if (input_->stream_index() != index_.stream) {
      input_->fail(fmt::format("its frame index is for stream {}, its video stream is {}", index_.stream,
                               input_->stream_index()));
    }
    codec_ = input_->open_decoder();
    draining_ = false;
    decoded_ = 0;
  }

  std::span<const std::uint8_t> bytes_;
  const FrameIndex& index_;
  std::vector<std::int64_t> wanted_pts_;
  std::string_view name_;
  std::unique_ptr<AvInput> input_;
  detail::CodecPtr codec_;
  detail::PacketPtr packet_ = detail::make_packet();
  detail::FramePtr frame_ = detail::make_frame();
  bool draining_ = false;
  std::optional<std::size_t> decoded_;  // frames since the first, unless sought
};

// The last keyframe at or before position `frame`; frames before the first
// keyframe have none.
std::optional<std::size_t> keyframe_before(const FrameIndex& index, std::size_t frame) {
  for (std::size_t i = frame + 1; i-- > 0;) {
    if (index.keyframe[i] != 0) return i;
  }
  return std::nullopt;
}

}  // namespace

void decode_frames(std::span<const std::uint8_t> container, const FrameIndex& index,
                   std::span<const std::size_t> wanted, std::string_view name,
                   const std::function<void(std::size_t k, const Image& rgb)>& sink, bool exact_rgb) {
  if (wanted.empty()) return;
  if (index.keyframe.size() != index.frames()) {
    throw_error(Errc::kInvalidArgument,
                fmt::format("decode_frames: {}: the frame index's keyframe flags do not match its frames", name));
  }
  if (!std::is_sorted(wanted.begin(), wanted.end()) || wanted.back() >= index.frames()) {
    throw_error(Errc::kInvalidArgument,
                fmt::format("decode_frames: {}: wanted frames must ascend and be below {}", name, index.frames()));
  }
  std::vector<std::int64_t> wanted_pts;
  for (const std::size_t w : wanted) wanted_pts.push_back(index.pts[w]);  // ascending, as wanted is
  FrameReader reader(container, index, std::move(wanted_pts), name);
  RgbConverter converter(exact_rgb);
  Image rgb;
  std::size_t k = 0;
  // One pass from the start: seeking proved unreliable, or frames are
  // counted rather than matched by timestamp.
  bool from_start = index.decode_order;
  // Where the decoder is: the position of the last frame it gave, or none
  // (just opened or just sought).
  std::optional<std::size_t> at;
  auto start_run = [&] {
    const std::optional<std::size_t> key = keyframe_before(index, wanted[k]);
    // Decoding on is cheaper than a seek unless a keyframe lies between
    // where the decoder is and the wanted frame.
    if (from_start || !key || (at && *key <= *at)) return;
    if (!reader.seek(*key)) {
      from_start = true;
      reader.restart();
    }
    at.reset();
  };
  const auto missing = [&] {
    reader.input().fail(fmt::format("frame {} (pts {}) is not in its decoded stream", wanted[k], index.pts[wanted[k]]));
  };
  start_run();
  while (k < wanted.size()) {
    if (!reader.next()) {
      if (!from_start) {
        from_start = true;
        reader.restart();
        at.reset();
        continue;
      }
      missing();
    }
    std::size_t p = 0;
    if (index.decode_order) {
      p = reader.count().value();  // never sought: seek() refuses
      if (p >= index.frames()) continue;
    } else {
      const std::int64_t ts = reader.timestamp();
      const auto pos = std::lower_bound(index.pts.begin(), index.pts.end(), ts);
      if (pos == index.pts.end() || *pos != ts) continue;  // a frame the index does not list
      p = static_cast<std::size_t>(pos - index.pts.begin());
    }
    if (p > wanted[k]) {
      // The seek landed after the wanted frame (a container whose seek
      // index disagrees with its timestamps): decode from the start.
      if (from_start) missing();
      from_start = true;
      reader.restart();
      at.reset();
      continue;
    }
    at = p;
    if (p < wanted[k]) continue;
    converter.convert(reader.frame(), rgb, reader.input());
    for (; k < wanted.size() && wanted[k] == p; ++k) sink(k, rgb);
    if (k < wanted.size()) start_run();
  }
}

}  // namespace dlop::media
