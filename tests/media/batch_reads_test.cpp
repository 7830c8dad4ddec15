// BatchReads over real tar shards: every sample's bytes as the shards' own
// read() gives them, whatever the batch (neighbours, scattered, repeated,
// across shards), with one request per run of neighbours and none for a
// sample alone or past a member too large to read through.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <cstring>
#include <fstream>
#include <numeric>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "media/source.hpp"
#include "source/concrete_sources.hpp"
#include "test_data.hpp"

namespace dlop::media {
namespace {

// A ustar archive written by hand: the tar format is the input under test.
class TarWriter {
 public:
  explicit TarWriter(const std::filesystem::path& path) : out_(path, std::ios::binary) {}
  ~TarWriter() { out_.write(std::string(1024, '\0').data(), 1024); }
  TarWriter(const TarWriter&) = delete;
  TarWriter& operator=(const TarWriter&) = delete;

  void add(const std::string& name, const std::string& bytes) {
    char h[512] = {};
    std::memcpy(h, name.data(), name.size());
    std::memcpy(h + 100, "0000644", 8);
    std::memcpy(h + 108, "0000000", 8);
    std::memcpy(h + 116, "0000000", 8);
    std::memcpy(h + 124, fmt::format("{:011o}", bytes.size()).c_str(), 12);
    std::memcpy(h + 136, "00000000000", 12);
    h[156] = '0';
    std::memcpy(h + 257, "ustar", 6);
    std::memcpy(h + 263, "00", 2);
    std::memset(h + 148, ' ', 8);
    unsigned sum = 0;
    for (const char c : h) sum += static_cast<unsigned char>(c);
    std::memcpy(h + 148, fmt::format("{:06o}", sum).c_str(), 7);
    out_.write(h, 512);
    out_.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    out_.write(std::string((512 - bytes.size() % 512) % 512, '\0').data(),
               static_cast<std::streamsize>((512 - bytes.size() % 512) % 512));
  }

 private:
  std::ofstream out_;
};

// Sample k's bytes: its own, of a length that varies (odd ones included).
std::string sample_bytes(int shard, int k) {
  std::string s(static_cast<std::size_t>(300 + 977 * k % 5000), '\0');
  for (std::size_t i = 0; i < s.size(); ++i) s[i] = static_cast<char>((shard * 131 + k * 31 + i * 7) & 0xff);
  return s;
}

class BatchReadsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // Shard 0: 12 samples; sample 5 is followed by a 100 KiB member that no
    // run reads through. Shard 1: 7 samples.
    for (const auto& [shard, count] : {std::pair{0, 12}, std::pair{1, 7}}) {
      TarWriter tar(dir_.path() / fmt::format("part-{}.tar", shard));
      for (int k = 0; k < count; ++k) {
        const std::string key = fmt::format("s{:02d}", k);
        tar.add(key + ".jpg", sample_bytes(shard, k));
        tar.add(key + ".cls", std::to_string(k % 3));
        if (shard == 0 && k == 5) tar.add(key + ".json", std::string(100 << 10, 'x'));
      }
    }
    shards_ = std::make_unique<TarShards>(dir_.path().string(), MediaKind::kImage);
  }

  // Checks every sample of the batch against the shards' own read and
  // returns the requests BatchReads made.
  std::size_t check(const std::vector<std::uint64_t>& batch) {
    const BatchReads reads(*shards_, batch);
    std::vector<std::uint8_t> a, b;
    for (const std::uint64_t i : batch) {
      const auto got = reads.read(i, a);
      const auto want = shards_->read(i, b);
      EXPECT_TRUE(std::equal(got.begin(), got.end(), want.begin(), want.end())) << "sample " << i;
      EXPECT_EQ(reads.label(i), shards_->label(i));
    }
    return reads.requests();
  }

  test::TempDir dir_;
  std::unique_ptr<TarShards> shards_;
};

TEST_F(BatchReadsTest, TheShardsAreAsWritten) {
  ASSERT_EQ(shards_->size(), 19u);
  EXPECT_EQ(shards_->shard_sizes(), (std::vector<std::uint64_t>{12, 7}));
  std::vector<std::uint8_t> scratch;
  const auto bytes = shards_->read(13, scratch);
  EXPECT_EQ(std::string(bytes.begin(), bytes.end()), sample_bytes(1, 1));
}

TEST_F(BatchReadsTest, NeighboursAreOneRequestAndTheBytesAreTheSame) {
  EXPECT_EQ(check({0, 1, 2, 3}), 1u);
  EXPECT_EQ(check({3, 2, 1, 0}), 1u) << "the order of the batch does not matter";
  EXPECT_EQ(check({6, 7, 8, 9, 10, 11, 12, 13, 14}), 2u) << "the end of one shard and the start of the next";
  EXPECT_EQ(check({1, 3}), 1u) << "a gap of a sample is read through";
  EXPECT_EQ(check({2, 2, 3}), 1u) << "a sample twice (DistributedSampler's padding)";
}

TEST_F(BatchReadsTest, LoneSamplesAndLargeGapsAreReadOneByOne) {
  EXPECT_EQ(check({}), 0u);
  EXPECT_EQ(check({4}), 0u);
  EXPECT_EQ(check({0, 11, 12}), 0u) << "no two samples of one shard close together";
  EXPECT_EQ(check({5, 6}), 0u) << "the 100 KiB member between them is past the gap limit";
  EXPECT_EQ(check({3, 4, 5, 6, 7, 8}), 2u);
  std::vector<std::uint64_t> all(19);
  std::iota(all.begin(), all.end(), 0);
  EXPECT_EQ(check(all), 3u);
}

TEST_F(BatchReadsTest, SamplesOutsideTheBatchAndOutOfRangeGoToTheSource) {
  const std::vector<std::uint64_t> batch{0, 1};
  const BatchReads reads(*shards_, batch);
  std::vector<std::uint8_t> a, b;
  const auto got = reads.read(9, a);
  const auto want = shards_->read(9, b);
  EXPECT_TRUE(std::equal(got.begin(), got.end(), want.begin(), want.end()));
  EXPECT_THROW(reads.read(19, a), Error);
  const std::vector<std::uint64_t> bad{0, 1, 99};
  EXPECT_EQ(BatchReads(*shards_, bad).requests(), 1u) << "an index out of range is left to the batch maker to name";
}

}  // namespace
}  // namespace dlop::media
