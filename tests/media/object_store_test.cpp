// The object store's local half and its location rules: ranged reads and
// streaming reads of a file against its bytes, across sizes (empty, one
// byte, odd, larger than a stream chunk), a stream stopped early, reads past
// the end and a missing file failing by name, and a PUT to a local path.
// Remote objects are tested against real servers in
// tests/python/test_offload_store.py.
#include <gtest/gtest.h>


#include "core/error.hpp"
#include "media/object_store.hpp"
#include "media/source.hpp"
#include "source/concrete_sources.hpp"
#include "test_data.hpp"

namespace dlop::media {
namespace {

using test::TempDir;

std::vector<std::uint8_t> pattern(std::size_t n) {
  std::vector<std::uint8_t> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<std::uint8_t>((i * 131 + i / 7) & 0xff);
  return v;
}

TEST(ObjectStore, TellsRemoteFromLocal) {
  EXPECT_TRUE(is_remote("s3://bucket/key"));
  EXPECT_TRUE(is_remote("http://host/x"));
  EXPECT_TRUE(is_remote("https://host/x"));
  EXPECT_FALSE(is_remote("/data/train.dlop"));
  EXPECT_FALSE(is_remote("s3:/not-a-url"));
  EXPECT_FALSE(is_remote("relative/http://x"));
}

TEST(ObjectStore, LocalReadsAndStreamsEveryByte) {
  TempDir dir;
  for (const std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{4097}, std::size_t{(1u << 20) * 2 + 3}}) {
    const auto bytes = pattern(n);
    const auto path = dir.path() / ("obj" + std::to_string(n));
    test::write_file(path, bytes);
    const auto object = open_object(path.string());
    ASSERT_EQ(object->size(), n);
    EXPECT_EQ(object->location(), path.string());
    for (const std::uint64_t offset : {std::uint64_t{0}, std::uint64_t{n / 3}, std::uint64_t{n}}) {
      std::vector<std::uint8_t> got(n - offset);
      object->read(offset, got);
      EXPECT_TRUE(std::equal(got.begin(), got.end(), bytes.begin() + static_cast<std::ptrdiff_t>(offset))) << n << "@" << offset;
      std::vector<std::uint8_t> streamed;
      object->stream(offset, [&](std::span<const std::uint8_t> c) {
        streamed.insert(streamed.end(), c.begin(), c.end());
        return true;
      });
      EXPECT_EQ(streamed, got) << n << "@" << offset;
    }
  }
}

TEST(ObjectStore, AStreamStopsWhenAsked) {
  TempDir dir;
  const auto bytes = pattern((1u << 20) * 3);
  test::write_file(dir.path() / "big", bytes);
  const auto object = open_object((dir.path() / "big").string());
  int chunks = 0;
  object->stream(5, [&](std::span<const std::uint8_t> c) {
    EXPECT_EQ(c[0], bytes[5]);
    ++chunks;
    return false;
  });
  EXPECT_EQ(chunks, 1);
}

TEST(ObjectStore, ReadsPastTheEndAndMissingFilesNameTheObject) {
  TempDir dir;
  test::write_file(dir.path() / "ten", pattern(10));
  const auto object = open_object((dir.path() / "ten").string());
  std::vector<std::uint8_t> out(4);
  try {
    object->read(8, out);
    FAIL() << "read past the end";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("ten: bytes 8+4 are past its end (10 bytes)"), std::string::npos) << e.what();
  }
  try {
    open_object((dir.path() / "missing").string());
    FAIL() << "opened a missing file";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("missing: cannot open"), std::string::npos) << e.what();
  }
}

TEST(ObjectStore, PutToALocalPathCopiesTheFile) {
  TempDir dir;
  const auto bytes = pattern(777);
  test::write_file(dir.path() / "src", bytes);
  test::write_file(dir.path() / "dst", pattern(3));
  put_object((dir.path() / "dst").string(), dir.path() / "src");
  EXPECT_EQ(test::read_file(dir.path() / "dst"), bytes);
}

TEST(ObjectStore, AnS3UrlWithoutAKeyIsRefused) {
  EXPECT_THROW(open_object("s3://bucket-only"), Error);
  EXPECT_THROW(open_object("s3://bucket/"), Error);
}

TEST(ShardList, BracesAndColonsExpandInOrder) {
  using V = std::vector<std::string>;
  EXPECT_EQ(expand_shards("s3://b/train-{08..11}.tar"),
            (V{"s3://b/train-08.tar", "s3://b/train-09.tar", "s3://b/train-10.tar", "s3://b/train-11.tar"}));
  EXPECT_EQ(expand_shards("{x,y}-{1..2}.tar::http://h/z.tar"),
            (V{"x-1.tar", "x-2.tar", "y-1.tar", "y-2.tar", "http://h/z.tar"}));
  EXPECT_EQ(expand_shards("one.tar"), (V{"one.tar"}));
  EXPECT_THROW(expand_shards("t-{3..1}.tar"), Error);
  EXPECT_THROW(expand_shards("t-{a..c}.tar"), Error);
  EXPECT_THROW(expand_shards("t-{1..2.tar"), Error);

  TempDir dir;  // a folder: its .tar files by name, nothing else
  for (const char* f : {"b.tar", "a.tar", "notes.txt"}) test::write_file(dir.path() / f, {1});
  EXPECT_EQ(expand_shards(dir.path().string()), (V{(dir.path() / "a.tar").string(), (dir.path() / "b.tar").string()}));
  EXPECT_TRUE(names_tar_shards(dir.path().string()));
  EXPECT_TRUE(names_tar_shards("s3://b/x-{0..3}.tar"));
  EXPECT_FALSE(names_tar_shards("s3://b/x.dlop"));
}

}  // namespace
}  // namespace dlop::media
