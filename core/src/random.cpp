#include "core/random.hpp"

#include "core/error.hpp"

namespace dlop {

SampleRng::SampleRng(const SampleKey& key, std::uint64_t stream) {
  // Each field goes through the mixer before the next is added, so nearby
  // keys ((seed, epoch, i) and (seed, epoch, i + 1)) give unrelated states.
  std::uint64_t h = mix64(key.seed ^ 0x6a09e667f3bcc908ULL);
  h = mix64(h ^ key.epoch);
  h = mix64(h ^ key.index);
  state_ = mix64(h ^ stream);
}

std::int64_t SampleRng::randint(std::int64_t lo, std::int64_t hi) {
  if (hi <= lo) throw_error(Errc::kInvalidArgument, "randint: empty range");
  const std::uint64_t range = static_cast<std::uint64_t>(hi - lo);
  // Rejects the top partial copy of [0, range) in 2^64, so every value is
  // equally likely; the loop runs more than once with probability < range / 2^64.
  const std::uint64_t limit = ~std::uint64_t{0} - (~std::uint64_t{0} % range + 1) % range;
  std::uint64_t x;
  do {
    x = next_u64();
  } while (x > limit);
  return lo + static_cast<std::int64_t>(x % range);
}

}  // namespace dlop
