// Sources: ImageFolder's order and labels (torchvision's rules worked out by
// hand for a tree with nested folders, odd names and non-images), record
// files round-tripping a folder, and damaged record files failing cleanly.
#include <gtest/gtest.h>

#include <unistd.h>

#include <zlib.h>

#include <cstring>
#include <fstream>

#include "media/codec.hpp"
#include "media/source.hpp"
#include "source/concrete_sources.hpp"
#include "test_data.hpp"

namespace dlop::media {
namespace {

namespace fs = std::filesystem;
using test::TempDir;
using test::write_file;

std::vector<std::uint8_t> small_jpeg(std::uint32_t seed) { return encode_jpeg(test::make_image(16, 20, seed), 80); }

// A tree whose torchvision order is known: classes sorted bytewise ("B" < "a"),
// folders by path string ("a/x" < "a/x-y"), files by name, extensions any case.
void make_tree(const fs::path& root) {
  std::uint32_t seed = 0;
  for (const char* f : {"a/2.jpg", "a/10.PNG", "a/x/1.jpeg", "a/x-y/0.jpg", "a/notes.txt", "B/z.jpg", "c/only.png", "c/d/e/deep.jpg"}) {
    const std::string name = f;
    write_file(root / name, name.ends_with(".txt") ? std::vector<std::uint8_t>{'h', 'i'}
                            : name.ends_with(".png") || name.ends_with(".PNG") ? encode_png(test::make_image(8, 8, seed))
                                                                                : small_jpeg(seed));
    ++seed;
  }
  fs::create_directories(root / "c" / "empty-subfolder");
  write_file(root / "toplevel.jpg", small_jpeg(99));  // not in a class: ignored
}

TEST(ImageFolder, OrderAndLabelsAsTorchvision) {
  TempDir dir;
  make_tree(dir.path());
  const ImageFolder folder(dir.path());
  EXPECT_EQ(folder.classes(), (std::vector<std::string>{"B", "a", "c"}));
  const std::vector<std::pair<std::string, std::int64_t>> want{
      {"B/z.jpg", 0}, {"a/10.PNG", 1}, {"a/2.jpg", 1}, {"a/x/1.jpeg", 1}, {"a/x-y/0.jpg", 1},
      {"c/only.png", 2}, {"c/d/e/deep.jpg", 2}};
  ASSERT_EQ(folder.size(), want.size());
  for (std::size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(folder.relative_path(i), want[i].first) << i;
    EXPECT_EQ(folder.label(i), want[i].second) << i;
  }
  std::vector<std::uint8_t> scratch;
  const auto bytes = folder.read(6, scratch);
  EXPECT_EQ(std::vector<std::uint8_t>(bytes.begin(), bytes.end()), test::read_file(dir.path() / "c/d/e/deep.jpg"));
}

TEST(ImageFolder, ErrorsNameTheProblem) {
  TempDir dir;
  EXPECT_THROW(ImageFolder(dir.path() / "missing"), Error);
  try {
    ImageFolder{dir.path()};
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no class sub-folders"), std::string::npos) << e.what();
  }
  write_file(dir.path() / "cat/1.jpg", small_jpeg(1));
  write_file(dir.path() / "dog/readme.txt", {'x'});
  try {
    ImageFolder{dir.path()};
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("file in class folder(s) dog"), std::string::npos) << e.what();
  }
  // A file torchvision's ImageFolder lists but no native decoder reads is
  // refused by name, never left out of the dataset.
  write_file(dir.path() / "dog/2.bmp", {'B', 'M'});
  try {
    ImageFolder{dir.path()};
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("dog/2.bmp"), std::string::npos) << e.what();
  }
  fs::remove(dir.path() / "dog/2.bmp");
  // A file that vanished after the scan is a sample error naming it.
  fs::remove(dir.path() / "dog/readme.txt");
  write_file(dir.path() / "dog/1.png", small_jpeg(2));
  const ImageFolder folder(dir.path());
  fs::remove(dir.path() / "dog/1.png");
  std::vector<std::uint8_t> scratch;
  EXPECT_THROW(folder.read(1, scratch), SampleError);
}

TEST(RecordFile, PackRoundTrip) {
  TempDir dir;
  make_tree(dir.path() / "tree");
  const PackStats stats = pack_image_folder(dir.path() / "tree", dir.path() / "data.dlop");
  const ImageFolder folder(dir.path() / "tree");
  EXPECT_EQ(stats.records, folder.size());
  EXPECT_EQ(stats.classes, 3u);
  EXPECT_EQ(stats.bytes, fs::file_size(dir.path() / "data.dlop"));

  const auto src = open_source(dir.path() / "data.dlop");
  const auto* rec = dynamic_cast<const RecordFile*>(src.get());
  ASSERT_NE(rec, nullptr);
  EXPECT_EQ(rec->version(), 2u);
  EXPECT_EQ(rec->classes(), folder.classes());
  ASSERT_EQ(rec->size(), folder.size());
  std::vector<std::uint8_t> a, b;
  for (std::size_t i = 0; i < folder.size(); ++i) {
    const auto x = rec->read(i, a);
    const auto y = folder.read(i, b);
    EXPECT_TRUE(std::equal(x.begin(), x.end(), y.begin(), y.end())) << i;
    EXPECT_EQ(rec->label(i), folder.label(i));
    EXPECT_NE(rec->name(i).find(folder.relative_path(i)), std::string::npos) << rec->name(i);
  }
  EXPECT_THROW(rec->read(folder.size(), a), Error);
  EXPECT_FALSE(fs::exists(dir.path() / ("data.dlop.tmp." + std::to_string(::getpid()))));
}

// Version 1 of a version 2 file: the same header and index without the
// label pool and time spans (what dlop wrote before), checksums redone.
std::vector<std::uint8_t> as_version_1(std::vector<std::uint8_t> v2, std::size_t records, std::size_t classes,
                                       std::size_t labels) {
  const auto u64_at = [&](std::size_t at) {
    std::uint64_t x = 0;
    std::memcpy(&x, v2.data() + at, 8);
    return x;
  };
  const auto put_u32 = [&](std::size_t at, std::uint32_t x) { std::memcpy(v2.data() + at, &x, 4); };
  const auto put_u64 = [&](std::size_t at, std::uint64_t x) { std::memcpy(v2.data() + at, &x, 8); };
  const std::size_t extras_at = 80 + records * 40 + classes * 8;
  const std::size_t extras_size = 8 + records * 24 + labels * 8;
  EXPECT_EQ(u64_at(extras_at), labels);
  v2.erase(v2.begin() + static_cast<std::ptrdiff_t>(extras_at), v2.begin() + static_cast<std::ptrdiff_t>(extras_at + extras_size));
  put_u32(8, 1);
  put_u64(16, u64_at(16) - extras_size);  // file_size
  put_u64(48, u64_at(48) - extras_size);  // meta_size
  put_u64(56, u64_at(56) - extras_size);  // data_offset
  put_u32(72, crc32(0, v2.data() + 80, static_cast<uInt>(u64_at(48))));
  put_u32(76, crc32(0, v2.data(), 76));
  return v2;
}

TEST(RecordFile, Version1FilesAreStillRead) {
  TempDir dir;
  make_tree(dir.path() / "tree");
  pack_image_folder(dir.path() / "tree", dir.path() / "v2.dlop");
  const ImageFolder folder(dir.path() / "tree");
  write_file(dir.path() / "v1.dlop",
             as_version_1(test::read_file(dir.path() / "v2.dlop"), folder.size(), folder.classes().size(), folder.size()));
  const RecordFile v1(dir.path() / "v1.dlop");
  EXPECT_EQ(v1.version(), 1u);
  ASSERT_EQ(v1.size(), folder.size());
  EXPECT_FALSE(v1.multi_label());
  std::vector<std::uint8_t> a, b;
  for (std::size_t i = 0; i < folder.size(); ++i) {
    const auto x = v1.read(i, a);
    const auto y = folder.read(i, b);
    EXPECT_TRUE(std::equal(x.begin(), x.end(), y.begin(), y.end())) << i;
    EXPECT_EQ(v1.labels(i), std::vector<std::int64_t>{folder.label(i)});
    EXPECT_EQ(v1.time_span(i), TimeSpan{});
    EXPECT_TRUE(v1.sidecar(i, a).empty());
  }
}

std::string open_error(const fs::path& path) {
  try {
    RecordFile r(path);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(RecordFile, DamagedFilesFailCleanly) {
  TempDir dir;
  make_tree(dir.path() / "tree");
  const fs::path good = dir.path() / "good.dlop";
  pack_image_folder(dir.path() / "tree", good);
  const auto bytes = test::read_file(good);
  const fs::path bad = dir.path() / "bad.dlop";
  const auto damaged = [&](auto change) {
    auto copy = bytes;
    change(copy);
    write_file(bad, copy);
    return open_error(bad);
  };
  EXPECT_NE(damaged([](auto& b) { b.clear(); }).find("shorter than the 80-byte header"), std::string::npos);
  EXPECT_NE(damaged([](auto& b) { b[0] = 'X'; }).find("bad magic"), std::string::npos);
  EXPECT_NE(damaged([](auto& b) { b[8] = 3; }).find("version 3 is not supported"), std::string::npos);
  EXPECT_NE(damaged([](auto& b) { b[30] ^= 1; }).find("header checksum mismatch"), std::string::npos);
  EXPECT_NE(damaged([](auto& b) { b.resize(b.size() - 1); }).find("truncated or appended"), std::string::npos);
  EXPECT_NE(damaged([](auto& b) { b[85] ^= 1; }).find("index checksum mismatch"), std::string::npos);

  // Every single-byte change in the header and index is caught at open: the
  // checksums see them all, and no change reads out of bounds (ASan build).
  const std::size_t meta_end = 80 + 7 * 40 + 3 * 8;
  for (std::size_t i = 0; i < meta_end; ++i) {
    EXPECT_NE(damaged([&](auto& b) { b[i] ^= 0x5A; }), "") << "byte " << i;
  }

  // A damaged record opens fine and fails only that sample, naming it.
  auto copy = bytes;
  copy[copy.size() - 10] ^= 0xFF;  // inside the last record
  write_file(bad, copy);
  const RecordFile rec(bad);
  std::vector<std::uint8_t> scratch;
  EXPECT_NO_THROW(rec.read(0, scratch));
  try {
    rec.read(rec.size() - 1, scratch);
    ADD_FAILURE();
  } catch (const SampleError& e) {
    EXPECT_NE(e.reason().find("checksum mismatch"), std::string::npos);
    EXPECT_NE(e.sample().find("c/d/e/deep.jpg"), std::string::npos) << e.sample();
  }
}

}  // namespace
}  // namespace dlop::media
