// Test inputs made on the fly: synthetic images (encoded with libjpeg/libpng
// through dlop's encoders) and temporary folders. No binary files in the repo.
#pragma once

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "media/image.hpp"

namespace dlop::media::test {

// Gradients, a disc and noise: smooth enough to compress, busy enough that
// resizing and cropping errors show.
inline Image make_image(int height, int width, std::uint32_t seed) {
  Image img;
  img.reshape(height, width);
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> noise(-12, 12);
  const int cx = static_cast<int>(rng() % static_cast<unsigned>(width));
  const int cy = static_cast<int>(rng() % static_cast<unsigned>(height));
  const int r2 = (height * width) / 12;
  for (int y = 0; y < height; ++y) {
    for (int x = 0; x < width; ++x) {
      std::uint8_t* p = &img.pixels[(static_cast<std::size_t>(y) * width + x) * 3];
      const bool disc = (x - cx) * (x - cx) + (y - cy) * (y - cy) < r2;
      const int base[3] = {x * 255 / width, y * 255 / height, disc ? 220 : (x + y) % 64};
      for (int c = 0; c < 3; ++c) p[c] = static_cast<std::uint8_t>(std::clamp(base[c] + noise(rng), 0, 255));
    }
  }
  return img;
}

inline void write_file(const std::filesystem::path& path, const std::vector<std::uint8_t>& bytes) {
  std::filesystem::create_directories(path.parent_path());
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

inline std::vector<std::uint8_t> read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// A fresh folder under the system's temp dir, removed with the object.
class TempDir {
 public:
  TempDir() {
    std::random_device rd;
    path_ = std::filesystem::temp_directory_path() / ("dlop-offload-test-" + std::to_string(rd()) + std::to_string(rd()));
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

}  // namespace dlop::media::test
