#include "av_input.hpp"

extern "C" {
#include <libavutil/log.h>
}

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <mutex>

#include "media/image.hpp"

namespace dlop::media::detail {
namespace {

constexpr int kIoBufferBytes = 64 * 1024;

// A corrupt file is reported once, as the sample's SampleError; FFmpeg's own
// log lines for it would only repeat that on stderr, from every worker. A
// program that chose a log level keeps it.
void quiet_ffmpeg_log() {
  static std::once_flag once;
  std::call_once(once, [] {
    if (av_log_get_level() == AV_LOG_INFO) av_log_set_level(AV_LOG_FATAL);
  });
}

}  // namespace

std::string av_error(int code) {
  char text[AV_ERROR_MAX_STRING_SIZE] = {};
  av_strerror(code, text, sizeof text);
  return text;
}

PacketPtr make_packet() {
  PacketPtr p(av_packet_alloc());
  if (!p) throw std::bad_alloc();
  return p;
}

FramePtr make_frame() {
  FramePtr f(av_frame_alloc());
  if (!f) throw std::bad_alloc();
  return f;
}

int AvInput::read(void* opaque, std::uint8_t* buf, int size) {
  auto* m = static_cast<Memory*>(opaque);
  const auto left = static_cast<std::int64_t>(m->bytes.size()) - m->at;
  if (left <= 0) return AVERROR_EOF;
  const int n = static_cast<int>(std::min<std::int64_t>(left, size));
  std::memcpy(buf, m->bytes.data() + m->at, static_cast<std::size_t>(n));
  m->at += n;
  return n;
}

std::int64_t AvInput::seek(void* opaque, std::int64_t offset, int whence) {
  auto* m = static_cast<Memory*>(opaque);
  const auto size = static_cast<std::int64_t>(m->bytes.size());
  switch (whence & ~AVSEEK_FORCE) {
    case AVSEEK_SIZE:
      return size;
    case SEEK_SET:
      break;
    case SEEK_CUR:
      offset += m->at;
      break;
    case SEEK_END:
      offset += size;
      break;
    default:
      return AVERROR(EINVAL);
  }
  if (offset < 0 || offset > size) return AVERROR(EINVAL);
  m->at = offset;
  return offset;
}

AvInput::AvInput(std::span<const std::uint8_t> bytes, std::string_view name) : name_(name), memory_{bytes} {
  quiet_ffmpeg_log();
  if (bytes.empty()) fail("empty file (0 bytes)");
  auto* buffer = static_cast<std::uint8_t*>(av_malloc(kIoBufferBytes));
  if (buffer == nullptr) throw std::bad_alloc();
  io_.reset(avio_alloc_context(buffer, kIoBufferBytes, 0, &memory_, &AvInput::read, nullptr, &AvInput::seek));
  if (!io_) {
    av_free(buffer);
    throw std::bad_alloc();
  }
  AVFormatContext* format = avformat_alloc_context();
  if (format == nullptr) throw std::bad_alloc();
  format->pb = io_.get();
  format->flags |= AVFMT_FLAG_CUSTOM_IO;
  // On failure avformat_open_input frees the context (not the I/O context).
  if (const int rc = avformat_open_input(&format, nullptr, nullptr, nullptr); rc < 0) {
    fail(fmt::format("not a container FFmpeg reads: {}", av_error(rc)));
  }
  format_.reset(format);
  // Containers with a full header (mp4, mkv, webm) need no probing decode;
  // the others (transport streams, raw streams) get FFmpeg's analysis.
  bool described = false;
  for (unsigned i = 0; i < format->nb_streams; ++i) {
    const AVCodecParameters* par = format->streams[i]->codecpar;
    if (par->codec_type == AVMEDIA_TYPE_VIDEO && par->codec_id != AV_CODEC_ID_NONE && par->width > 0) described = true;
  }
  if (!described) {
    if (const int rc = avformat_find_stream_info(format, nullptr); rc < 0) {
      fail(fmt::format("cannot read its streams: {}", av_error(rc)));
    }
  }
  stream_ = av_find_best_stream(format, AVMEDIA_TYPE_VIDEO, -1, -1, &codec_, 0);
  if (stream_ == AVERROR_STREAM_NOT_FOUND) fail("no video stream");
  if (stream_ == AVERROR_DECODER_NOT_FOUND) {
    const int any = av_find_best_stream(format, AVMEDIA_TYPE_VIDEO, -1, -1, nullptr, 0);
    fail(fmt::format("no decoder for its video codec {} in this FFmpeg",
                     avcodec_get_name(format->streams[any < 0 ? 0 : any]->codecpar->codec_id)));
  }
  if (stream_ < 0) fail(fmt::format("no usable video stream: {}", av_error(stream_)));
  for (unsigned i = 0; i < format->nb_streams; ++i) {
    format->streams[i]->discard = static_cast<int>(i) == stream_ ? AVDISCARD_DEFAULT : AVDISCARD_ALL;
  }
}

void AvInput::fail(std::string_view reason) const { throw SampleError(name_, std::string(reason)); }

bool AvInput::read_video_packet(AVPacket* packet) {
  for (;;) {
    const int rc = av_read_frame(format_.get(), packet);
    if (rc == AVERROR_EOF) return false;
    if (rc < 0) fail(fmt::format("demuxing failed: {}", av_error(rc)));
    if (packet->stream_index == stream_) return true;
    av_packet_unref(packet);
  }
}

CodecPtr AvInput::open_decoder() const {
  CodecPtr codec(avcodec_alloc_context3(codec_));
  if (!codec) throw std::bad_alloc();
  if (const int rc = avcodec_parameters_to_context(codec.get(), stream()->codecpar); rc < 0) {
    fail(fmt::format("bad codec parameters: {}", av_error(rc)));
  }
  // The worker pool runs one sample per thread; frame threads would
  // oversubscribe it.
  codec->thread_count = 1;
  codec->pkt_timebase = stream()->time_base;
  if (const int rc = avcodec_open2(codec.get(), codec_, nullptr); rc < 0) {
    fail(fmt::format("cannot open the {} decoder: {}", codec_->name, av_error(rc)));
  }
  return codec;
}

}  // namespace dlop::media::detail
