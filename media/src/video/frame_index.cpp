// The frame index: demuxed packets' timestamps sorted into presentation
// order, and its small binary form (the sidecar `dlop pack` stores).
#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <numeric>

#include "av_input.hpp"
#include "media/video.hpp"

namespace dlop::media {
namespace {

// "DLFI", a version, then little-endian fields; the header's size is fixed
// and each frame takes an int64 pts and a keyframe byte.
constexpr std::uint8_t kMagic[4] = {'D', 'L', 'F', 'I'};
constexpr std::uint32_t kVersion = 1;
constexpr std::size_t kHeaderBytes = 4 + 4 + 4 + 5 * 4 + 8;
constexpr std::uint32_t kDecodeOrder = 1;
constexpr std::size_t kFrameBytes = 8 + 1;
constexpr int kMaxDimension = 1 << 16;

template <class T>
void put(std::vector<std::uint8_t>& out, T value) {
  auto bits = static_cast<std::make_unsigned_t<T>>(value);
  for (std::size_t i = 0; i < sizeof(T); ++i) out.push_back(static_cast<std::uint8_t>(bits >> (8 * i)));
}

class Reader {
 public:
  Reader(std::span<const std::uint8_t> bytes, std::string_view name) : bytes_(bytes), name_(name) {}
  template <class T>
  T get() {
    if (bytes_.size() - at_ < sizeof(T)) fail("truncated");
    std::make_unsigned_t<T> bits = 0;
    for (std::size_t i = 0; i < sizeof(T); ++i) {
      bits |= static_cast<std::make_unsigned_t<T>>(bytes_[at_ + i]) << (8 * i);
    }
    at_ += sizeof(T);
    return static_cast<T>(bits);
  }
  std::size_t left() const { return bytes_.size() - at_; }
  [[noreturn]] void fail(std::string_view what) const {
    throw SampleError(std::string(name_), fmt::format("frame index: {}", what));
  }

 private:
  std::span<const std::uint8_t> bytes_;
  std::string_view name_;
  std::size_t at_ = 0;
};

}  // namespace

double FrameIndex::seconds(std::size_t frame) const {
  return static_cast<double>(pts.at(frame)) * time_base_num / time_base_den;
}

std::vector<std::uint8_t> FrameIndex::serialize() const {
  std::vector<std::uint8_t> out(kMagic, kMagic + 4);
  out.reserve(kHeaderBytes + frames() * kFrameBytes);
  put(out, kVersion);
  put(out, decode_order ? kDecodeOrder : std::uint32_t{0});
  put(out, std::int32_t{stream});
  put(out, time_base_num);
  put(out, time_base_den);
  put(out, std::int32_t{width});
  put(out, std::int32_t{height});
  put(out, static_cast<std::uint64_t>(frames()));
  for (const std::int64_t p : pts) put(out, p);
  for (std::size_t i = 0; i < frames(); ++i) out.push_back(keyframe.at(i) != 0 ? 1 : 0);
  return out;
}

FrameIndex FrameIndex::parse(std::span<const std::uint8_t> bytes, std::string_view name) {
  Reader r(bytes, name);
  if (bytes.size() < 4 || std::memcmp(bytes.data(), kMagic, 4) != 0) r.fail("bad magic (not a frame index)");
  r.get<std::uint32_t>();
  if (const auto version = r.get<std::uint32_t>(); version != kVersion) {
    r.fail(fmt::format("version {} (this reader knows {})", version, kVersion));
  }
  FrameIndex index;
  const auto flags = r.get<std::uint32_t>();
  if ((flags & ~kDecodeOrder) != 0) r.fail(fmt::format("unknown flags {:#x}", flags));
  index.decode_order = (flags & kDecodeOrder) != 0;
  index.stream = r.get<std::int32_t>();
  index.time_base_num = r.get<std::int32_t>();
  index.time_base_den = r.get<std::int32_t>();
  index.width = r.get<std::int32_t>();
  index.height = r.get<std::int32_t>();
  const auto count = r.get<std::uint64_t>();
  if (index.stream < 0) r.fail(fmt::format("negative stream {}", index.stream));
  if (index.time_base_num <= 0 || index.time_base_den <= 0) {
    r.fail(fmt::format("time base {}/{} is not positive", index.time_base_num, index.time_base_den));
  }
  if (index.width <= 0 || index.height <= 0 || index.width > kMaxDimension || index.height > kMaxDimension) {
    r.fail(fmt::format("frame size {}x{} out of range", index.width, index.height));
  }
  // Checked against the bytes present before anything is allocated.
  if (count == 0 || count > r.left() / kFrameBytes || r.left() != count * kFrameBytes) {
    r.fail(fmt::format("{} frames do not match its {} bytes", count, bytes.size()));
  }
  index.pts.resize(count);
  for (auto& p : index.pts) p = r.get<std::int64_t>();
  index.keyframe.resize(count);
  for (auto& k : index.keyframe) {
    k = r.get<std::uint8_t>();
    if (k > 1) r.fail("keyframe flag other than 0 or 1");
  }
  if (std::adjacent_find(index.pts.begin(), index.pts.end(), std::greater_equal<>()) != index.pts.end()) {
    r.fail("timestamps not strictly ascending");
  }
  return index;
}

FrameIndex scan_frame_index(std::span<const std::uint8_t> container, std::string_view name) {
  detail::AvInput input(container, name);
  const AVStream* stream = input.stream();
  FrameIndex index;
  index.stream = input.stream_index();
  index.time_base_num = stream->time_base.num;
  index.time_base_den = stream->time_base.den;
  index.width = stream->codecpar->width;
  index.height = stream->codecpar->height;
  if (index.time_base_num <= 0 || index.time_base_den <= 0) input.fail("its video stream has no time base");
  if (index.width <= 0 || index.height <= 0) input.fail("its video stream has no frame size");

  struct Entry {
    std::int64_t pts;
    bool key;
  };
  std::vector<Entry> entries;
  detail::PacketPtr packet = detail::make_packet();
  std::int64_t last = AV_NOPTS_VALUE;
  while (input.read_video_packet(packet.get())) {
    // Packets an edit list cuts off are decoded but never shown (decoders
    // drop their frames), so they are not frames of the video.
    const bool shown = packet->size > 0 && (packet->flags & AV_PKT_FLAG_DISCARD) == 0;
    if (shown) {
      // Without a pts the index falls back to the dts; with neither, the
      // frame follows the previous one.
      if (packet->pts == AV_NOPTS_VALUE) index.decode_order = true;
      std::int64_t pts = packet->pts != AV_NOPTS_VALUE ? packet->pts : packet->dts;
      if (pts == AV_NOPTS_VALUE) pts = last == AV_NOPTS_VALUE ? 0 : last + std::max<std::int64_t>(packet->duration, 1);
      entries.push_back({pts, (packet->flags & AV_PKT_FLAG_KEY) != 0});
      last = pts;
    }
    av_packet_unref(packet.get());
  }
  // Packets come in decoding order; B-frames are shown before the frames
  // they were decoded after. (With decode_order, the dts may not say when a
  // frame is shown; the count of frames still holds.)
  if (index.decode_order) {
    for (std::size_t i = 1; i < entries.size(); ++i) entries[i].pts = std::max(entries[i].pts, entries[i - 1].pts + 1);
  }
  std::stable_sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) { return a.pts < b.pts; });
  // A timestamp shown twice cannot tell its frames apart: the first stays.
  const auto same = [](const Entry& a, const Entry& b) { return a.pts == b.pts; };
  entries.erase(std::unique(entries.begin(), entries.end(), same), entries.end());
  if (entries.empty()) input.fail("no video frames");
  index.pts.reserve(entries.size());
  index.keyframe.reserve(entries.size());
  for (const Entry& e : entries) {
    index.pts.push_back(e.pts);
    index.keyframe.push_back(e.key ? 1 : 0);
  }
  return index;
}

}  // namespace dlop::media
