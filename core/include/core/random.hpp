// Counter-based randomness: every draw is a pure function of (seed, epoch,
// sample index, stream, draw number), so a sample's augmentation is the same
// whichever thread, process or host computes it, and in whatever order.
// The media pipelines draw their augmentations from it, and the offload
// library's epoch plans their shuffles.
#pragma once

#include <cstdint>

namespace dlop {

// Which sample a draw belongs to.
struct SampleKey {
  std::uint64_t seed = 0;
  std::uint64_t epoch = 0;
  std::uint64_t index = 0;  // the sample's index in its source
};

// splitmix64's output function: a bijective 64-bit mixer.
constexpr std::uint64_t mix64(std::uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return x;
}

// Draw n of a stream is mix64(key + n * golden): splitmix64 with its state
// derived from the key instead of carried between samples. `stream` separates
// independent users of one sample (each op of a pipeline gets its own), so
// adding a draw to one op never shifts another's.
class SampleRng {
 public:
  SampleRng(const SampleKey& key, std::uint64_t stream);

  std::uint64_t next_u64() { return mix64(state_ += kGolden); }
  // Uniform in [0, 1) with 53 random bits.
  double uniform() { return static_cast<double>(next_u64() >> 11) * 0x1.0p-53; }
  double uniform(double lo, double hi) { return lo + (hi - lo) * uniform(); }
  // Uniform integer in [lo, hi), hi > lo, without modulo bias.
  std::int64_t randint(std::int64_t lo, std::int64_t hi);

 private:
  static constexpr std::uint64_t kGolden = 0x9e3779b97f4a7c15ULL;
  std::uint64_t state_;
};

}  // namespace dlop
