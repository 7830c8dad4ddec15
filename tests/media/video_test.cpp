// Video: the frame index and exact decoding against the ffmpeg and ffprobe
// command-line tools (a second, independent reader of the same files), and
// the clip pipeline's sampling, layouts, randomness and error policies.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <numeric>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <unistd.h>

#include "media/batch_maker.hpp"
#include "media/video.hpp"
#include "test_data.hpp"

namespace dlop::media {
namespace {

namespace fs = std::filesystem;
using test::read_file;

std::string capture(const std::string& command) {
  std::string out;
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return out;
  char buffer[4096];
  std::size_t n;
  while ((n = fread(buffer, 1, sizeof buffer, pipe)) > 0) out.append(buffer, n);
  const int rc = pclose(pipe);
  if (rc != 0) ADD_FAILURE() << "exit " << rc << ": " << command;
  return out;
}

void run(const std::string& command) {
  ASSERT_EQ(std::system((command + " > /dev/null 2>&1").c_str()), 0) << command;
}

bool has_encoder(const std::string& name) {
  return capture("ffmpeg -hide_banner -encoders 2>/dev/null").find(" " + name + " ") != std::string::npos;
}

// One test clip: how it was made, and what the tools say about it.
struct Clip {
  std::string file;
  int width;
  int height;
};

// The clips: every container and codec this FFmpeg can write, B-frames,
// short and long GOPs, odd sizes, variable rate. ctest runs each test in a
// process of its own, so they are made once per build, not once per test:
// in a folder of the build tree named by a hash of the FFmpeg version and
// the commands that make them, which a process fills under a name of its own
// and renames into place (a process that loses that race uses the winner's).
class Clips {
 public:
  static Clips& get() {
    static Clips clips;
    return clips;
  }
  const fs::path& dir() const { return dir_; }
  const std::vector<Clip>& all() const { return clips_; }
  fs::path path(const std::string& file) const { return dir() / file; }
  std::vector<std::uint8_t> bytes(const std::string& file) const { return read_file(path(file)); }

  // ffprobe's presentation timestamps of every decoded frame.
  std::vector<std::int64_t> probe_pts(const std::string& file) const {
    std::istringstream lines(capture("ffprobe -v error -select_streams v:0 -show_entries frame=pts -of csv=p=0 " +
                                     path(file).string()));
    std::vector<std::int64_t> pts;
    for (std::string line; std::getline(lines, line);) {
      if (!line.empty()) pts.push_back(line.starts_with("N/A") ? -1 : std::stoll(line));
    }
    return pts;
  }
  // ffprobe's keyframe packets, by pts.
  std::vector<std::int64_t> probe_keyframes(const std::string& file) const {
    std::istringstream lines(capture(
        "ffprobe -v error -select_streams v:0 -show_entries packet=pts,flags -of csv=p=0 " + path(file).string()));
    std::vector<std::int64_t> keys;
    for (std::string line; std::getline(lines, line);) {
      const auto comma = line.find(',');
      if (comma != std::string::npos && line[comma + 1] == 'K') keys.push_back(std::stoll(line.substr(0, comma)));
    }
    std::sort(keys.begin(), keys.end());
    return keys;
  }
  // Every frame as ffmpeg converts it to RGB with the flags decode_frames
  // uses: exact, or ffmpeg's defaults.
  const std::vector<std::uint8_t>& reference(const std::string& file, bool exact = true) {
    auto& frames = reference_[file + (exact ? "" : ".fast")];
    if (frames.empty()) {
      const fs::path raw = dir() / (file + (exact ? ".rgb" : ".fast.rgb"));
      if (!fs::exists(raw)) {
        const fs::path partial = unique_name(raw);
        run("ffmpeg -hide_banner -v error -y -i " + path(file).string() + " -map 0:v:0 -fps_mode passthrough " +
            (exact ? "-sws_flags bicubic+bitexact+accurate_rnd " : "") + "-f rawvideo -pix_fmt rgb24 " +
            partial.string());
        fs::rename(partial, raw);
      }
      frames = read_file(raw);
    }
    return frames;
  }

 private:
  Clips() {
    // The commands first, run below unless the build already has their clips.
    std::vector<std::string> commands;
    const std::string ff = "ffmpeg -hide_banner -v error -y -f lavfi -i ";
    const auto make = [&](const std::string& file, int w, int h, const std::string& source, const std::string& args) {
      commands.push_back(ff + source + " " + args + " " + file);
      clips_.push_back({file, w, h});
    };
    const auto src = [](int w, int h, double seconds, const std::string& kind = "testsrc2") {
      return kind + "=size=" + std::to_string(w) + "x" + std::to_string(h) + ":rate=25 -t " + std::to_string(seconds);
    };
    make("h264_gop16.mp4", 160, 120, src(160, 120, 2), "-c:v libx264 -g 16 -bf 2 -pix_fmt yuv420p");
    make("h264_gop250.mp4", 160, 120, src(160, 120, 3), "-c:v libx264 -g 250 -bf 2 -pix_fmt yuv420p");
    // testsrc2 makes even sides only; H.264's 4:2:0 needs even sides too, its
    // 4:4:4 takes any.
    make("h264_odd.mp4", 321, 241, src(320, 240, 1), "-vf scale=321:241 -c:v libx264 -g 16 -bf 2 -pix_fmt yuv444p");
    make("vp9_odd.webm", 321, 241, src(320, 240, 1),
         "-vf scale=321:241 -c:v libvpx-vp9 -g 16 -deadline realtime -cpu-used 8");
    make("hevc.mkv", 160, 120, src(160, 120, 2, "mandelbrot"),
         "-c:v libx265 -x265-params log-level=error:keyint=16:bframes=2 -pix_fmt yuv420p");
    if (has_encoder("libaom-av1")) {
      make("av1.mkv", 96, 64, src(96, 64, 1), "-c:v libaom-av1 -cpu-used 8 -g 16");
    }
    // Variable frame rate: 40 ms steps, every fifth frame 15 ms late, the
    // whole drifting 7 ms per ten frames, on a millisecond clock.
    make("vfr.mp4", 160, 120, src(160, 120, 2),
         "-vf \"settb=1/1000,setpts='(N*40+if(mod(N\\,5)\\,0\\,15)+floor(N/10)*7)/1000/TB'\" -fps_mode vfr "
         "-enc_time_base 1/1000 -c:v libx264 -g 16 -bf 2");
    // AVI stores no pts: with B-frames, frames are found by their count.
    make("mpeg4_bframes.avi", 160, 120, src(160, 120, 2), "-c:v mpeg4 -g 12 -bf 2");
    // A still picture, losslessly coded: every decoded frame is the same.
    make("still.mp4", 160, 120, src(160, 120, 2, "smptebars"), "-c:v libx264 -qp 0 -g 8 -bf 2 -pix_fmt yuv444p");

    std::string key = capture("ffmpeg -hide_banner -version 2>/dev/null | head -n 1");
    for (const auto& command : commands) key += command;
    dir_ = fs::path(DLOP_TEST_FIXTURE_DIR) / ("video-clips-" + std::to_string(std::hash<std::string>{}(key)));
    if (fs::exists(dir_)) return;
    const fs::path partial = unique_name(dir_);
    fs::create_directories(partial);
    for (const auto& command : commands) {
      if (std::system(("cd " + partial.string() + " && " + command + " > /dev/null 2>&1").c_str()) != 0) {
        ADD_FAILURE() << "making a test clip failed: " << command;
        fs::remove_all(partial);  // never leave a broken set where the next run would take it
        return;
      }
    }
    std::error_code lost_the_race;
    fs::rename(partial, dir_, lost_the_race);
    if (lost_the_race) fs::remove_all(partial);
  }

  // A sibling of `path` no other process uses.
  static fs::path unique_name(const fs::path& path) {
    return fs::path(path.string() + ".partial-" + std::to_string(getpid()));
  }

  fs::path dir_;
  std::vector<Clip> clips_;
  std::map<std::string, std::vector<std::uint8_t>> reference_;
};

std::vector<std::uint8_t> reference_frame(const std::vector<std::uint8_t>& all, const Clip& clip, std::size_t k) {
  const std::size_t bytes = static_cast<std::size_t>(clip.width) * clip.height * 3;
  if ((k + 1) * bytes > all.size()) return {};
  const auto at = all.begin() + static_cast<std::ptrdiff_t>(k * bytes);
  return {at, at + static_cast<std::ptrdiff_t>(bytes)};
}

// Decodes `wanted` and checks every frame against ffmpeg's, in order.
void expect_frames_match(const Clip& clip, const FrameIndex& index, const std::vector<std::size_t>& wanted,
                         bool exact = true) {
  const auto bytes = Clips::get().bytes(clip.file);
  const auto& reference = Clips::get().reference(clip.file, exact);
  ASSERT_EQ(reference.size(), index.frames() * static_cast<std::size_t>(clip.width) * clip.height * 3) << clip.file;
  std::size_t next = 0;
  decode_frames(bytes, index, wanted, clip.file, [&](std::size_t k, const Image& rgb) {
    ASSERT_EQ(k, next++) << clip.file;
    ASSERT_EQ(rgb.width, clip.width);
    ASSERT_EQ(rgb.height, clip.height);
    EXPECT_TRUE(rgb.pixels == reference_frame(reference, clip, wanted[k]))
        << clip.file << ": frame " << wanted[k] << " differs from ffmpeg's";
  }, exact);
  EXPECT_EQ(next, wanted.size()) << clip.file;
}

TEST(VideoIndex, MatchesFfprobe) {
  for (const Clip& clip : Clips::get().all()) {
    SCOPED_TRACE(clip.file);
    const FrameIndex index = scan_frame_index(Clips::get().bytes(clip.file), clip.file);
    EXPECT_EQ(index.width, clip.width);
    EXPECT_EQ(index.height, clip.height);
    EXPECT_EQ(index.decode_order, clip.file.ends_with(".avi"));
    if (index.decode_order) {
      EXPECT_EQ(index.frames(), Clips::get().probe_pts(clip.file).size());
      continue;
    }
    EXPECT_EQ(index.pts, Clips::get().probe_pts(clip.file));
    std::vector<std::int64_t> keys;
    for (std::size_t i = 0; i < index.frames(); ++i) {
      if (index.keyframe[i] != 0) keys.push_back(index.pts[i]);
    }
    EXPECT_EQ(keys, Clips::get().probe_keyframes(clip.file));
    EXPECT_EQ(index.keyframe.front(), 1);
  }
  // The long GOP has one keyframe; the short one a keyframe every 16 frames
  // at most.
  const FrameIndex long_gop = scan_frame_index(Clips::get().bytes("h264_gop250.mp4"), "long");
  EXPECT_EQ(long_gop.frames(), 75u);
  EXPECT_EQ(std::count(long_gop.keyframe.begin(), long_gop.keyframe.end(), 1), 1);
  const FrameIndex short_gop = scan_frame_index(Clips::get().bytes("h264_gop16.mp4"), "short");
  EXPECT_GE(std::count(short_gop.keyframe.begin(), short_gop.keyframe.end(), 1), 50 / 16);
  // Variable rate: the steps between frames are not all the same.
  const FrameIndex vfr = scan_frame_index(Clips::get().bytes("vfr.mp4"), "vfr");
  std::set<std::int64_t> steps;
  for (std::size_t i = 1; i < vfr.frames(); ++i) steps.insert(vfr.pts[i] - vfr.pts[i - 1]);
  EXPECT_GE(steps.size(), 3u);
}

TEST(VideoIndex, SerializeRoundTripsAndRejectsMalformedBytes) {
  const FrameIndex index = scan_frame_index(Clips::get().bytes("h264_gop16.mp4"), "a.mp4");
  const std::vector<std::uint8_t> bytes = index.serialize();
  const FrameIndex back = FrameIndex::parse(bytes, "a.mp4");
  EXPECT_EQ(back.pts, index.pts);
  EXPECT_EQ(back.keyframe, index.keyframe);
  EXPECT_EQ(back.stream, index.stream);
  EXPECT_EQ(back.time_base_num, index.time_base_num);
  EXPECT_EQ(back.time_base_den, index.time_base_den);
  EXPECT_EQ(back.width, index.width);
  EXPECT_EQ(back.height, index.height);
  EXPECT_EQ(back.decode_order, false);
  EXPECT_EQ(back.serialize(), bytes);
  FrameIndex counted = index;
  counted.decode_order = true;
  EXPECT_TRUE(FrameIndex::parse(counted.serialize(), "b.avi").decode_order);

  const auto rejects = [](std::vector<std::uint8_t> b, const std::string& why) {
    try {
      FrameIndex::parse(b, "clip.mp4");
      ADD_FAILURE() << "accepted: " << why;
    } catch (const SampleError& e) {
      EXPECT_EQ(e.sample(), "clip.mp4") << why;
    }
  };
  for (std::size_t n = 0; n < bytes.size(); n += (n < 64 ? 1 : 97)) {
    rejects({bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(n)}, "truncated to " + std::to_string(n));
  }
  auto extra = bytes;
  extra.push_back(0);
  rejects(extra, "a trailing byte");
  auto magic = bytes;
  magic[0] = 'X';
  rejects(magic, "bad magic");
  auto version = bytes;
  version[4] = 2;
  rejects(version, "unknown version");
  auto huge = bytes;
  for (std::size_t i = 32; i < 40; ++i) huge[i] = 0xff;  // the frame count
  rejects(huge, "a count of 2^64 - 1");
  auto zero_base = bytes;
  std::fill(zero_base.begin() + 20, zero_base.begin() + 24, 0);  // the time base's denominator
  rejects(zero_base, "a zero time base");
  auto unordered = bytes;
  std::copy_n(bytes.begin() + 40, 8, unordered.begin() + 48);  // frame 1's pts := frame 0's
  rejects(unordered, "timestamps not ascending");
  auto flags = bytes;
  flags[9] = 1;
  rejects(flags, "an unknown flag");
  auto flag = bytes;
  flag.back() = 7;
  rejects(flag, "a keyframe flag of 7");
}

TEST(VideoDecode, RandomFramesEqualFfmpegsOnEveryFormat) {
  std::mt19937 rng(12345);
  for (const Clip& clip : Clips::get().all()) {
    SCOPED_TRACE(clip.file);
    const auto bytes = Clips::get().bytes(clip.file);
    const FrameIndex index = scan_frame_index(bytes, clip.file);
    const std::size_t n = index.frames();
    // Single frames at both ends, a pair far apart (a seek between), and
    // random sets with repeats.
    std::vector<std::vector<std::size_t>> sets{{0}, {n - 1}, {1, n - 2}, {n / 2, n / 2, n / 2 + 1}};
    for (int trial = 0; trial < 4; ++trial) {
      std::vector<std::size_t> wanted(1 + rng() % 8);
      for (auto& w : wanted) w = rng() % n;
      std::sort(wanted.begin(), wanted.end());
      sets.push_back(wanted);
    }
    for (const auto& wanted : sets) expect_frames_match(clip, index, wanted);
  }
  // Every frame of one file, in one pass.
  const Clip& first = Clips::get().all().front();
  const FrameIndex index = scan_frame_index(Clips::get().bytes(first.file), first.file);
  std::vector<std::size_t> all(index.frames());
  std::iota(all.begin(), all.end(), 0);
  expect_frames_match(first, index, all);
}

// "rgb": "fast" converts as ffmpeg (and torchcodec and PyAV) do by default.
TEST(VideoDecode, FastConversionEqualsFfmpegDefaults) {
  for (const Clip& clip : Clips::get().all()) {
    if (clip.file.ends_with(".avi")) continue;
    SCOPED_TRACE(clip.file);
    const FrameIndex index = scan_frame_index(Clips::get().bytes(clip.file), clip.file);
    const std::size_t n = index.frames();
    expect_frames_match(clip, index, {0, n / 3, n / 2, n - 1}, /*exact=*/false);
  }
}

TEST(VideoDecode, BadFilesAreSampleErrorsNamingTheFile) {
  const auto fails = [](const std::vector<std::uint8_t>& bytes, const std::string& reason) {
    try {
      const FrameIndex index = scan_frame_index(bytes, "bad.mp4");
      std::vector<std::size_t> all(index.frames());
      std::iota(all.begin(), all.end(), 0);
      decode_frames(bytes, index, all, "bad.mp4", [](std::size_t, const Image&) {});
      ADD_FAILURE() << "no error for " << reason;
    } catch (const SampleError& e) {
      EXPECT_EQ(e.sample(), "bad.mp4") << reason;
      EXPECT_NE(std::string(e.what()).find("bad.mp4"), std::string::npos) << e.what();
    }
  };
  const auto mp4 = Clips::get().bytes("h264_gop16.mp4");
  fails({}, "an empty file");
  fails(std::vector<std::uint8_t>(5000, 0x5a), "bytes that are no container");
  fails({mp4.begin(), mp4.begin() + static_cast<std::ptrdiff_t>(mp4.size() / 2)}, "a truncated mp4");
  const test::TempDir audio_dir;
  run("ffmpeg -hide_banner -v error -y -f lavfi -i sine=duration=0.5 -c:a aac " +
      (audio_dir.path() / "audio.m4a").string());
  try {
    scan_frame_index(read_file(audio_dir.path() / "audio.m4a"), "audio.m4a");
    ADD_FAILURE() << "an audio file has a frame index";
  } catch (const SampleError& e) {
    EXPECT_NE(std::string(e.what()).find("no video stream"), std::string::npos) << e.what();
  }
}

// Samples from memory: bytes, labels, spans and sidecars as a test sets them.
class MemorySource final : public Source {
 public:
  struct Item {
    std::string name;
    std::vector<std::uint8_t> bytes;
    std::int64_t label = 0;
    TimeSpan span;
    std::vector<std::uint8_t> sidecar;
  };
  // A multi-label source gives sample i the classes label(i) and label(i) + 1.
  explicit MemorySource(std::vector<Item> items, bool multi = false) : items_(std::move(items)), multi_(multi) {}
  bool multi_label() const override { return multi_; }
  std::vector<std::int64_t> labels(std::size_t i) const override {
    if (!multi_) return {label(i)};
    return {label(i), (label(i) + 1) % 3};
  }
  std::size_t size() const override { return items_.size(); }
  const std::vector<std::string>& classes() const override { return classes_; }
  std::int64_t label(std::size_t i) const override { return items_.at(i).label; }
  std::string name(std::size_t i) const override { return items_.at(i).name; }
  std::span<const std::uint8_t> read(std::size_t i, std::vector<std::uint8_t>&) const override {
    return items_.at(i).bytes;
  }
  TimeSpan time_span(std::size_t i) const override { return items_.at(i).span; }
  std::span<const std::uint8_t> sidecar(std::size_t i, std::vector<std::uint8_t>&) const override {
    return items_.at(i).sidecar;
  }

 private:
  std::vector<Item> items_;
  std::vector<std::string> classes_{"a", "b", "c"};
  bool multi_ = false;
};

MemorySource::Item item(const std::string& file, std::int64_t label = 0, TimeSpan span = {}) {
  return {file, Clips::get().bytes(file), label, span, {}};
}

struct Batch {
  SampleLayout layout;
  std::vector<std::byte> samples;
  std::vector<std::int64_t> labels;
  BatchResult result;
};

Batch run_batch(const std::string& spec, const Source& source, std::vector<std::uint64_t> indices,
                std::uint64_t seed = 1, std::uint64_t epoch = 0, std::size_t threads = 1) {
  const auto maker = make_batch_maker(spec);
  Batch b;
  b.layout = maker->layout(source);
  b.samples.assign(indices.size() * b.layout.sample_bytes(), std::byte{0xee});
  b.labels.assign(indices.size() * b.layout.label_width, -1);
  WorkerPool pool(threads);
  b.result = maker->run_batch(source, indices, seed, epoch, BatchOut{b.samples, b.labels, {}}, &pool);
  return b;
}

const std::uint8_t* u8(const Batch& b) { return reinterpret_cast<const std::uint8_t*>(b.samples.data()); }

TEST(VideoClip, FullFrameClipsEqualFfmpegsFrames) {
  // A center crop of the whole frame and uniform starts: the clip is the
  // decoded frames themselves, at positions computed here.
  const Clip clip{"vp9_odd.webm", 321, 241};
  const MemorySource source({item(clip.file)});
  const Batch b = run_batch(R"({"kind": "video", "frames": 4, "stride": 3, "views": 3, "start": "uniform",
                                "crop": [241, 321], "crop_position": "center", "layout": "TCHW"})",
                            source, {0});
  ASSERT_EQ(b.layout.shape, (std::vector<std::uint32_t>{3, 4, 3, 241, 321}));
  const FrameIndex index = scan_frame_index(Clips::get().bytes(clip.file), clip.file);
  const auto& reference = Clips::get().reference(clip.file);
  const std::size_t room = index.frames() - 10;  // the last start of a 10-frame span
  const std::size_t plane = 241 * 321;
  for (std::size_t v = 0; v < 3; ++v) {
    const std::size_t start = std::vector<std::size_t>{0, (room + 1) / 2, room}[v];
    for (std::size_t t = 0; t < 4; ++t) {
      const auto want = reference_frame(reference, clip, start + 3 * t);
      const std::uint8_t* got = u8(b) + ((v * 4 + t) * 3) * plane;
      bool same = true;
      for (std::size_t i = 0; i < plane && same; ++i) {
        for (std::size_t c = 0; c < 3; ++c) same = same && got[c * plane + i] == want[i * 3 + c];
      }
      EXPECT_TRUE(same) << "view " << v << " frame " << t;
    }
  }
}

TEST(VideoClip, LayoutsViewsLabelsAndFloatOutputAgree) {
  const MemorySource source({item("h264_gop16.mp4", 2), item("hevc.mkv", 1)});
  const std::string common = R"("frames": 5, "stride": 2, "views": 2, "jitter": 1, "short_side": [64, 80],
                                 "crop": [48, 56], "hflip": 0.5)";
  const Batch cthw = run_batch("{\"kind\": \"video\", " + common + "}", source, {0, 1});
  const Batch tchw = run_batch("{\"kind\": \"video\", \"layout\": \"TCHW\", " + common + "}", source, {0, 1});
  const Batch norm = run_batch(R"({"kind": "video", "output": "float32", "normalize": {"mean": [0.45, 0.4, 0.5],
                                   "std": [0.225, 0.25, 0.2]}, )" + common + "}",
                               source, {0, 1});
  EXPECT_EQ(cthw.layout.shape, (std::vector<std::uint32_t>{2, 3, 5, 48, 56}));
  EXPECT_EQ(tchw.layout.shape, (std::vector<std::uint32_t>{2, 5, 3, 48, 56}));
  EXPECT_EQ(norm.layout.dtype, OutputType::kFloat32);
  EXPECT_EQ(cthw.result.count, 2u);
  EXPECT_EQ(cthw.labels, (std::vector<std::int64_t>{2, 1}));
  const std::size_t plane = 48 * 56;
  const float mean[3] = {0.45f, 0.4f, 0.5f};
  const float stdev[3] = {0.225f, 0.25f, 0.2f};
  const auto* f = reinterpret_cast<const float*>(norm.samples.data());
  for (std::size_t n = 0; n < 2; ++n) {
    for (std::size_t v = 0; v < 2; ++v) {
      for (std::size_t c = 0; c < 3; ++c) {
        for (std::size_t t = 0; t < 5; ++t) {
          const std::size_t at_cthw = (((n * 2 + v) * 3 + c) * 5 + t) * plane;
          const std::size_t at_tchw = (((n * 2 + v) * 5 + t) * 3 + c) * plane;
          ASSERT_TRUE(std::equal(u8(cthw) + at_cthw, u8(cthw) + at_cthw + plane, u8(tchw) + at_tchw));
          for (std::size_t i = 0; i < plane; i += 97) {
            const float want = (static_cast<float>(u8(cthw)[at_cthw + i]) / 255.0f - mean[c]) / stdev[c];
            ASSERT_EQ(f[at_cthw + i], want);
          }
        }
      }
    }
  }
  const MemorySource multi({item("h264_gop16.mp4", 2), item("hevc.mkv", 0)}, true);
  const Batch multi_hot = run_batch("{\"kind\": \"video\", " + common + "}", multi, {0, 1});
  EXPECT_EQ(multi_hot.layout.label_width, 3u);
  EXPECT_EQ(multi_hot.labels, (std::vector<std::int64_t>{1, 0, 1, 1, 1, 0}));
  EXPECT_TRUE(multi_hot.samples == cthw.samples);
  // The two views of a sample are different clips.
  const std::size_t view = 3 * 5 * plane;
  EXPECT_FALSE(std::equal(u8(cthw), u8(cthw) + view, u8(cthw) + view));
}

TEST(VideoClip, SameKeySameBytesOnAnyNumberOfThreads) {
  std::vector<MemorySource::Item> items;
  for (const Clip& clip : Clips::get().all()) items.push_back(item(clip.file));
  const MemorySource source(std::move(items));
  std::vector<std::uint64_t> indices(source.size());
  std::iota(indices.begin(), indices.end(), 0);
  std::reverse(indices.begin(), indices.end());
  const std::string spec = R"({"kind": "video", "frames": 4, "stride": 2, "views": 2, "jitter": 2,
                               "short_side": [40, 60], "crop": 32, "hflip": 0.5})";
  const Batch one = run_batch(spec, source, indices, 7, 3, 1);
  const Batch four = run_batch(spec, source, indices, 7, 3, 4);
  EXPECT_EQ(one.result.count, source.size());
  EXPECT_TRUE(one.samples == four.samples);
  EXPECT_GT(four.result.seconds.decode, 0.0);
  // One sample alone is the same as in its batch: nothing depends on batch mates.
  const Batch alone = run_batch(spec, source, {indices[2]}, 7, 3, 1);
  const std::size_t size = one.layout.sample_bytes();
  EXPECT_TRUE(std::equal(alone.samples.begin(), alone.samples.end(),
                         one.samples.begin() + 2 * static_cast<std::ptrdiff_t>(size)));
  const Batch other_epoch = run_batch(spec, source, indices, 7, 4, 1);
  EXPECT_FALSE(one.samples == other_epoch.samples);
}

TEST(VideoClip, CropAndFlipAreDrawnOncePerView) {
  const MemorySource source({item("still.mp4")});
  const std::string common = R"("frames": 6, "stride": 3, "views": 4, "short_side": [60, 120], "crop": 40)";
  const Batch plain = run_batch("{" + common + ", \"kind\": \"video\", \"hflip\": 0}", source, {0}, 11);
  const Batch flipped = run_batch("{" + common + ", \"kind\": \"video\", \"hflip\": 1}", source, {0}, 11);
  const std::size_t plane = 40 * 40;
  std::set<std::vector<std::uint8_t>> views;
  for (std::size_t v = 0; v < 4; ++v) {
    for (std::size_t c = 0; c < 3; ++c) {
      const std::uint8_t* first = u8(plain) + ((v * 3 + c) * 6) * plane;
      for (std::size_t t = 1; t < 6; ++t) {
        EXPECT_TRUE(std::equal(first, first + plane, first + t * plane)) << "view " << v << " frame " << t;
      }
      // Flipping draws from a stream of its own: the same crop, mirrored.
      const std::uint8_t* mirror = u8(flipped) + ((v * 3 + c) * 6) * plane;
      for (std::size_t y = 0; y < 40; ++y) {
        for (std::size_t x = 0; x < 40; ++x) ASSERT_EQ(first[y * 40 + x], mirror[y * 40 + 39 - x]);
      }
    }
    views.insert({u8(plain) + v * 18 * plane, u8(plain) + v * 18 * plane + plane});
  }
  EXPECT_GT(views.size(), 1u) << "every view drew the same crop";
}

TEST(VideoClip, TimeSpansAndShortClips) {
  // 25 frames per second: [0.4, 0.8) s holds frames 10 to 19.
  const MemorySource source({item("h264_gop16.mp4", 0, {0.4, 0.8})});
  const Clip clip{"h264_gop16.mp4", 160, 120};
  const auto& reference = Clips::get().reference(clip.file);
  const std::string full = R"("kind": "video", "crop": [120, 160], "crop_position": "center", "layout": "TCHW")";
  const auto frame_is = [&](const Batch& b, std::size_t t, std::size_t k) {
    const std::size_t plane = 120 * 160;
    const auto want = reference_frame(reference, clip, k);
    const std::uint8_t* got = u8(b) + t * 3 * plane;
    for (std::size_t i = 0; i < plane; ++i) {
      for (std::size_t c = 0; c < 3; ++c) {
        if (got[c * plane + i] != want[i * 3 + c]) return false;
      }
    }
    return true;
  };
  // Random starts stay inside the span.
  for (std::uint64_t seed = 0; seed < 6; ++seed) {
    const Batch b = run_batch("{" + full + R"(, "frames": 2, "stride": 9})", source, {0}, seed);
    EXPECT_TRUE(frame_is(b, 0, 10) && frame_is(b, 1, 19)) << "seed " << seed;
  }
  // 10 frames where a clip needs 13: padded with the span's last frame.
  const Batch padded = run_batch("{" + full + R"(, "frames": 7, "stride": 2})", source, {0});
  for (std::size_t t = 0; t < 7; ++t) EXPECT_TRUE(frame_is(padded, t, std::min<std::size_t>(10 + 2 * t, 19))) << t;
  try {
    run_batch("{" + full + R"(, "frames": 7, "stride": 2, "short_clip": "error"})", source, {0});
    ADD_FAILURE() << "a short clip passed";
  } catch (const SampleError& e) {
    EXPECT_EQ(e.sample(), "h264_gop16.mp4");
    EXPECT_NE(std::string(e.what()).find("10 frames"), std::string::npos) << e.what();
  }
  // Jitter keeps frames inside the span and in order.
  for (std::uint64_t seed = 0; seed < 4; ++seed) {
    const Batch b = run_batch("{" + full + R"(, "frames": 5, "stride": 2, "jitter": 3})", source, {0}, seed);
    std::size_t last = 10;
    for (std::size_t t = 0; t < 5; ++t) {
      std::size_t k = last;
      while (k <= 19 && !frame_is(b, t, k)) ++k;
      ASSERT_LE(k, 19u) << "seed " << seed << ": frame " << t << " is not one of the span's, in order";
      last = k;
    }
  }
}

TEST(VideoClip, ErrorPoliciesAndSidecars) {
  auto bytes = Clips::get().bytes("h264_gop16.mp4");
  MemorySource::Item broken{"broken.mp4", {bytes.begin(), bytes.begin() + 3000}, 1, {}, {}};
  MemorySource::Item packed = item("h264_gop16.mp4", 2);
  packed.sidecar = scan_frame_index(bytes, "").serialize();
  MemorySource::Item bad_sidecar = item("vfr.mp4", 0);
  bad_sidecar.name = "bad_sidecar.mp4";
  bad_sidecar.sidecar = {1, 2, 3};
  const MemorySource source({item("hevc.mkv", 1), broken, packed, bad_sidecar});
  const std::string spec = R"({"kind": "video", "frames": 3, "crop": 32, "on_error": "ON"})";
  try {
    run_batch(std::string(spec).replace(spec.find("ON"), 2, "raise"), source, {0, 1, 2});
    ADD_FAILURE() << "a truncated file passed";
  } catch (const SampleError& e) {
    EXPECT_EQ(e.sample(), "broken.mp4") << e.what();
  }
  const Batch skipped = run_batch(std::string(spec).replace(spec.find("ON"), 2, "skip"), source, {0, 1, 2, 3});
  EXPECT_EQ(skipped.result.count, 2u);
  ASSERT_EQ(skipped.result.skipped.size(), 2u);
  EXPECT_EQ(skipped.result.skipped[0].index, 1u);
  EXPECT_EQ(skipped.result.skipped[1].index, 3u);
  const std::string& reason = skipped.result.skipped[1].reason;
  EXPECT_NE(reason.find("frame index"), std::string::npos) << reason;
  EXPECT_EQ(skipped.labels[0], 1);
  EXPECT_EQ(skipped.labels[1], 2);
  // The packed sample (its index from the sidecar) equals the same file scanned.
  // (At the same index: the index keys the randomness.)
  const MemorySource plain({item("hevc.mkv"), item("hevc.mkv"), item("h264_gop16.mp4", 2)});
  const Batch scanned = run_batch(std::string(spec).replace(spec.find("ON"), 2, "skip"), plain, {2}, 1);
  const Batch from_sidecar = run_batch(std::string(spec).replace(spec.find("ON"), 2, "skip"), source, {2}, 1);
  EXPECT_TRUE(scanned.samples == from_sidecar.samples);
}

TEST(VideoSpec, RejectsBadFieldsByName) {
  const auto rejects = [](const std::string& spec, const std::string& field) {
    try {
      make_batch_maker(spec);
      ADD_FAILURE() << "accepted " << spec;
    } catch (const SampleError&) {
      ADD_FAILURE() << "a spec error is not a sample error";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), Errc::kInvalidArgument);
      EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << e.what();
    }
  };
  rejects(R"({"kind": "video"})", "crop");
  rejects(R"({"kind": "video", "crop": 32, "frame": 8})", "frame");
  rejects(R"({"kind": "video", "crop": 32, "frames": 0})", "frames");
  rejects(R"({"kind": "video", "crop": 32, "stride": -1})", "stride");
  rejects(R"({"kind": "video", "crop": 32, "views": 1.5})", "views");
  rejects(R"({"kind": "video", "crop": 32, "start": "middle"})", "start");
  rejects(R"({"kind": "video", "crop": [32, 0]})", "crop");
  rejects(R"({"kind": "video", "crop": 64, "short_side": [48, 64]})", "short_side");
  rejects(R"({"kind": "video", "crop": 32, "short_side": [64, 48]})", "short_side");
  rejects(R"({"kind": "video", "crop": 32, "hflip": 2})", "hflip");
  rejects(R"({"kind": "video", "crop": 32, "layout": "THWC"})", "layout");
  rejects(R"({"kind": "video", "crop": 32, "short_clip": "loop"})", "short_clip");
  rejects(R"({"kind": "video", "crop": 32, "on_error": "ignore"})", "on_error");
  rejects(R"({"kind": "video", "crop": 32, "normalize": {"mean": [0, 0, 0], "std": [1, 1, 1]}})", "normalize");
  rejects(R"({"kind": "video", "crop": 32, "output": "float32", "normalize": {"mean": [0, 0, 0], "std": [1, 0, 1]}})",
          "std");
  rejects(R"({"kind": "video", "crop": 32, "output": "float32", "normalize": {"mean": [0, 0], "std": [1, 1, 1]}})",
          "mean");

  const auto maker = make_batch_maker(R"({"kind": "video", "crop": [32, 48], "short_side": 64})");
  EXPECT_EQ(maker->kind(), "video");
  EXPECT_EQ(maker->on_error(), ErrorPolicy::kRaise);
  const auto again = make_batch_maker(maker->to_json());
  EXPECT_EQ(again->to_json(), maker->to_json());
  const MemorySource source({item("hevc.mkv")});
  EXPECT_EQ(again->layout(source).shape, (std::vector<std::uint32_t>{1, 3, 16, 32, 48}));
  EXPECT_EQ(again->layout(source).dtype, OutputType::kUint8);
}

}  // namespace
}  // namespace dlop::media
