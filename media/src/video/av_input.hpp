// FFmpeg behind small owners: a container demuxed from memory through a
// custom AVIOContext, its video stream, and a decoder for it. Errors are
// SampleErrors naming the file.
#pragma once

extern "C" {
#include <libavcodec/avcodec.h>
#include <libavformat/avformat.h>
}

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>

namespace dlop::media::detail {

std::string av_error(int code);

struct PacketDeleter {
  void operator()(AVPacket* p) const { av_packet_free(&p); }
};
struct FrameDeleter {
  void operator()(AVFrame* f) const { av_frame_free(&f); }
};
struct CodecDeleter {
  void operator()(AVCodecContext* c) const { avcodec_free_context(&c); }
};
using PacketPtr = std::unique_ptr<AVPacket, PacketDeleter>;
using FramePtr = std::unique_ptr<AVFrame, FrameDeleter>;
using CodecPtr = std::unique_ptr<AVCodecContext, CodecDeleter>;

PacketPtr make_packet();
FramePtr make_frame();

// An opened container over bytes the caller keeps alive, with its best
// video stream chosen (the one ffprobe and ffmpeg pick). Not copyable: the
// I/O context points back at it.
class AvInput {
 public:
  AvInput(std::span<const std::uint8_t> bytes, std::string_view name);
  AvInput(const AvInput&) = delete;
  AvInput& operator=(const AvInput&) = delete;

  AVFormatContext* format() const { return format_.get(); }
  AVStream* stream() const { return format_->streams[stream_]; }
  int stream_index() const { return stream_; }
  const AVCodec* codec() const { return codec_; }
  const std::string& name() const { return name_; }
  // A SampleError naming the file.
  [[noreturn]] void fail(std::string_view reason) const;
  // The next packet of the video stream into `packet`; false at the end.
  // Read errors other than the end of the data are SampleErrors.
  bool read_video_packet(AVPacket* packet);
  // A single-threaded decoder for the stream.
  CodecPtr open_decoder() const;

 private:
  struct Memory {
    std::span<const std::uint8_t> bytes;
    std::int64_t at = 0;
  };
  static int read(void* opaque, std::uint8_t* buf, int size);
  static std::int64_t seek(void* opaque, std::int64_t offset, int whence);

  struct IoDeleter {
    void operator()(AVIOContext* io) const {
      av_freep(&io->buffer);  // FFmpeg may have replaced the one it was given
      avio_context_free(&io);
    }
  };
  struct FormatDeleter {
    void operator()(AVFormatContext* f) const { avformat_close_input(&f); }
  };

  std::string name_;
  Memory memory_;
  std::unique_ptr<AVIOContext, IoDeleter> io_;  // outlives format_, which reads through it
  std::unique_ptr<AVFormatContext, FormatDeleter> format_;
  int stream_ = -1;
  const AVCodec* codec_ = nullptr;
};

}  // namespace dlop::media::detail
