// Whole pipelines: determinism (a sample is a function of (seed, epoch,
// index) only, whichever thread makes it), the per-sample error policy, and
// batches equal to the samples made one by one.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <cstring>
#include <thread>

#include "media/codec.hpp"
#include "media/ops.hpp"
#include "media/image_pipeline.hpp"
#include "test_data.hpp"

namespace dlop::media {
namespace {

using test::make_image;

constexpr const char* kTrain = R"({"ops": [
  {"op": "random_resized_crop", "size": 64}, {"op": "hflip", "p": 0.5},
  {"op": "normalize", "mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225]}]})";

TEST(Random, DrawsDependOnlyOnTheKey) {
  SampleRng a(SampleKey{7, 1, 42}, 0), b(SampleKey{7, 1, 42}, 0);
  SampleRng other_epoch(SampleKey{7, 2, 42}, 0), other_index(SampleKey{7, 1, 43}, 0), other_stream(SampleKey{7, 1, 42}, 1);
  for (int i = 0; i < 100; ++i) {
    const std::uint64_t x = a.next_u64();
    EXPECT_EQ(x, b.next_u64());
    EXPECT_NE(x, other_epoch.next_u64());
    EXPECT_NE(x, other_index.next_u64());
    EXPECT_NE(x, other_stream.next_u64());
  }
  // randint covers its range evenly (chi-square-free check: each of 6 values
  // within 10% of its expected count over 60000 draws).
  int counts[6] = {};
  for (int i = 0; i < 60000; ++i) ++counts[a.randint(10, 16) - 10];
  for (const int c : counts) EXPECT_NEAR(c, 10000, 1000);
}

TEST(ImagePipeline, SameKeySameBytesFromAnyThread) {
  const auto jpeg = encode_jpeg(make_image(300, 400, 1), 90);
  const ImagePipeline p = ImagePipeline::from_json(kTrain);
  std::vector<Tensor> reference;
  for (std::uint64_t i = 0; i < 16; ++i) reference.push_back(p.run(jpeg, SampleKey{5, 3, i}));
  // Different indices give different crops (else the check below proves little).
  EXPECT_NE(reference[0].data, reference[1].data);
  EXPECT_NE(p.run(jpeg, SampleKey{5, 4, 0}).data, reference[0].data);

  // Four threads, each making every sample in its own order.
  std::vector<std::vector<Tensor>> made(4, std::vector<Tensor>(16));
  std::vector<std::thread> threads;
  for (std::size_t t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (std::uint64_t k = 0; k < 16; ++k) {
        const std::uint64_t i = (k * (2 * t + 1) + t) % 16;
        made[t][i] = p.run(jpeg, SampleKey{5, 3, i});
      }
    });
  }
  for (auto& th : threads) th.join();
  for (std::size_t t = 0; t < 4; ++t) {
    for (std::size_t i = 0; i < 16; ++i) ASSERT_EQ(made[t][i].data, reference[i].data) << t << " " << i;
  }
}

TEST(ImagePipeline, RunEqualsTheOpsComposedByHand) {
  const Image img = make_image(120, 90, 2);
  const auto png = encode_png(img);
  const ImagePipeline p = ImagePipeline::from_json(R"({"ops": [
      {"op": "resize", "size": 50}, {"op": "center_crop", "size": [40, 48]}, {"op": "hflip", "p": 1.0}],
      "output": "uint8"})");
  const Tensor t = p.run(png, SampleKey{});
  ASSERT_EQ(t.shape, (Shape{3, 40, 48}));
  const auto [h, w] = resize_shorter_side(120, 90, 50);
  Image resized = resize(img, h, w), cropped;
  crop(resized, center_crop_box(h, w, 40, 48), cropped);
  hflip(cropped);
  std::vector<std::uint8_t> want(t.shape.elements());
  to_chw_uint8(cropped, want.data());
  ASSERT_EQ(t.data.size(), want.size());
  EXPECT_EQ(std::memcmp(t.data.data(), want.data(), want.size()), 0);
}

// A flip just before normalize (or last) is left to the layout step, which
// mirrors as it writes: the result is bitwise that of the separate ops, and
// the flip draws from its own position's stream, as when it ran alone.
TEST(ImagePipeline, FlipBeforeTheLayoutStepEqualsTheSeparateOps) {
  const Image img = make_image(75, 101, 3);
  const auto png = encode_png(img);
  const std::array<float, 3> mean{0.485f, 0.456f, 0.406f}, stdev{0.229f, 0.224f, 0.225f};
  for (const char* output : {"float32", "uint8"}) {
    const bool f32 = std::string_view(output) == "float32";
    const ImagePipeline p = ImagePipeline::from_json(fmt::format(R"({{"ops": [
        {{"op": "center_crop", "size": [61, 47]}}, {{"op": "hflip", "p": 0.5}}{}], "output": "{}"}})",
        f32 ? R"(, {"op": "normalize", "mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225]})" : "", output));
    int flips = 0;
    for (std::uint64_t i = 0; i < 16; ++i) {
      const SampleKey key{4, 1, i};
      Image cropped;
      crop(img, center_crop_box(75, 101, 61, 47), cropped);
      const bool flip = SampleRng(key, 1).uniform() < 0.5;
      flips += flip;
      if (flip) hflip(cropped);
      const Tensor t = p.run(png, key);
      std::vector<std::byte> want(t.data.size());
      if (f32) {
        to_chw_float(cropped, mean, stdev, reinterpret_cast<float*>(want.data()));
      } else {
        to_chw_uint8(cropped, reinterpret_cast<std::uint8_t*>(want.data()));
      }
      ASSERT_EQ(t.data, want) << output << " " << i;
    }
    EXPECT_GT(flips, 0);
    EXPECT_LT(flips, 16);
  }
}

// A source held in memory, so the test can plant bad samples.
class MemorySource final : public Source {
 public:
  std::vector<std::vector<std::uint8_t>> samples;
  std::vector<std::string> class_names{"a", "b", "c"};
  std::size_t size() const override { return samples.size(); }
  const std::vector<std::string>& classes() const override { return class_names; }
  std::int64_t label(std::size_t i) const override { return static_cast<std::int64_t>(i % 3); }
  std::string name(std::size_t i) const override { return "mem/" + std::to_string(i) + ".jpg"; }
  std::span<const std::uint8_t> read(std::size_t i, std::vector<std::uint8_t>&) const override { return samples.at(i); }
};

MemorySource make_source(std::size_t n) {
  MemorySource s;
  for (std::size_t i = 0; i < n; ++i) s.samples.push_back(encode_jpeg(make_image(90 + 7 * static_cast<int>(i), 120, static_cast<std::uint32_t>(i)), 85));
  return s;
}

TEST(ImagePipeline, BatchEqualsSamplesOneByOneWithAnyThreadCount) {
  const MemorySource src = make_source(12);
  const ImagePipeline p = ImagePipeline::from_json(kTrain);
  const std::vector<std::uint64_t> indices{11, 3, 3, 0, 7, 5, 9, 1};
  const std::size_t bytes = 3 * 64 * 64 * 4;
  for (const std::size_t threads : {1u, 3u}) {
    WorkerPool pool(threads);
    std::vector<std::byte> images(indices.size() * bytes);
    std::vector<std::int64_t> labels(indices.size());
    const BatchResult r = p.run_batch(src, indices, 9, 2, images, labels, &pool);
    ASSERT_EQ(r.count, indices.size());
    EXPECT_TRUE(r.skipped.empty());
    EXPECT_GT(r.seconds.decode, 0.0);
    EXPECT_GT(r.seconds.augment, 0.0);
    EXPECT_GT(r.seconds.collate, 0.0);
    for (std::size_t k = 0; k < indices.size(); ++k) {
      const Tensor one = p.run(src.samples[indices[k]], SampleKey{9, 2, indices[k]});
      ASSERT_EQ(std::memcmp(images.data() + k * bytes, one.data.data(), bytes), 0) << threads << " " << k;
      EXPECT_EQ(labels[k], static_cast<std::int64_t>(indices[k] % 3));
    }
  }
}

TEST(ImagePipeline, SkipPolicyCountsBadSamplesAndKeepsTheOthersInOrder) {
  MemorySource src = make_source(6);
  src.samples[1].clear();                                  // zero bytes
  src.samples[4].resize(src.samples[4].size() / 2);        // truncated
  const std::string spec = R"({"ops": [{"op": "center_crop", "size": 32}], "output": "uint8", "on_error": "skip"})";
  const ImagePipeline p = ImagePipeline::from_json(spec);
  const std::vector<std::uint64_t> indices{0, 1, 2, 3, 4, 5};
  std::vector<std::byte> images(6 * 3 * 32 * 32);
  std::vector<std::int64_t> labels(6, -1);
  WorkerPool pool(2);
  const BatchResult r = p.run_batch(src, indices, 0, 0, images, labels, &pool);
  ASSERT_EQ(r.count, 4u);
  ASSERT_EQ(r.skipped.size(), 2u);
  EXPECT_EQ(r.skipped[0].index, 1u);
  EXPECT_NE(r.skipped[0].reason.find("mem/1.jpg: empty file"), std::string::npos) << r.skipped[0].reason;
  EXPECT_EQ(r.skipped[1].index, 4u);
  EXPECT_NE(r.skipped[1].reason.find("truncated"), std::string::npos) << r.skipped[1].reason;
  const std::size_t kept[] = {0, 2, 3, 5};
  for (std::size_t k = 0; k < 4; ++k) {
    const Tensor one = p.run(src.samples[kept[k]], SampleKey{0, 0, kept[k]});
    EXPECT_EQ(std::memcmp(images.data() + k * one.data.size(), one.data.data(), one.data.size()), 0) << k;
    EXPECT_EQ(labels[k], static_cast<std::int64_t>(kept[k] % 3));
  }
}

// The spec's load_truncated_images reaches the decoder, for the crop that
// decodes a region as for a whole decode.
TEST(ImagePipeline, LoadTruncatedImagesDecodesACutJpegInABatch) {
  MemorySource src = make_source(3);
  src.samples[1].resize(src.samples[1].size() * 2 / 3);
  for (const char* ops : {R"([{"op": "center_crop", "size": 32}])", R"([{"op": "random_resized_crop", "size": 32}])"}) {
    const std::string spec = fmt::format(R"({{"ops": {}, "output": "uint8", "load_truncated_images": true}})", ops);
    const ImagePipeline p = ImagePipeline::from_json(spec);
    std::vector<std::byte> images(3 * 3 * 32 * 32);
    std::vector<std::int64_t> labels(3, -1);
    const std::vector<std::uint64_t> indices{0, 1, 2};
    const BatchResult r = p.run_batch(src, indices, 0, 0, images, labels, nullptr);
    EXPECT_EQ(r.count, 3u) << ops;
    EXPECT_TRUE(r.skipped.empty()) << ops;
    EXPECT_THROW(ImagePipeline::from_json(fmt::format(R"({{"ops": {}, "output": "uint8"}})", ops))
                     .run(src.samples[1], SampleKey{0, 0, 1}),
                 SampleError)
        << ops;
  }
}

TEST(ImagePipeline, RaisePolicyThrowsTheFirstBadSampleInIndexOrder) {
  MemorySource src = make_source(5);
  src.samples[3].assign(100, 0x42);
  src.samples[2].clear();
  const ImagePipeline p = ImagePipeline::from_json(R"({"ops": [{"op": "center_crop", "size": 16}], "output": "uint8"})");
  const std::vector<std::uint64_t> indices{0, 3, 1, 2};
  std::vector<std::byte> images(4 * 3 * 16 * 16);
  std::vector<std::int64_t> labels(4);
  WorkerPool pool(3);
  try {
    p.run_batch(src, indices, 0, 0, images, labels, &pool);
    ADD_FAILURE() << "no error";
  } catch (const SampleError& e) {
    EXPECT_EQ(e.sample(), "mem/3.jpg");
    EXPECT_NE(e.reason().find("not a JPEG or PNG"), std::string::npos) << e.what();
  }
}

TEST(ImagePipeline, BatchArgumentErrors) {
  const MemorySource src = make_source(2);
  std::vector<std::byte> images(10);
  std::vector<std::int64_t> labels(2);
  const std::vector<std::uint64_t> two{0, 1}, out_of_range{2};
  EXPECT_THROW(ImagePipeline::from_json(R"({"ops": [{"op": "resize", "size": 8}]})").run_batch(src, two, 0, 0, images, labels),
               Error);  // no fixed shape
  const ImagePipeline p = ImagePipeline::from_json(R"({"ops": [{"op": "center_crop", "size": 8}]})");
  EXPECT_THROW(p.run_batch(src, two, 0, 0, images, labels), Error);  // buffer too small
  images.resize(3 * 8 * 8 * 4 * 2);
  EXPECT_THROW(p.run_batch(src, out_of_range, 0, 0, images, labels), Error);
}

}  // namespace
}  // namespace dlop::media
