// EpochPlan: the epoch's order and this rank's share of it, with nothing but
// (seed, epoch) as input, so every rank, every restart and the local
// fallback agree on which batch holds which samples.
#include <algorithm>

#include "core/error.hpp"
#include "offload/lease_manager.hpp"
#include "offload/random.hpp"

namespace dlop::offload {
namespace {

// The shuffle's draws use a sample index no real sample has and their own
// stream, so they never coincide with a sample's augmentation draws.
constexpr std::uint64_t kShuffleIndex = ~std::uint64_t{0};
constexpr std::uint64_t kShuffleStream = 0x5348554646ULL;  // "SHUFF"

}  // namespace

std::vector<std::uint64_t> EpochPlan::order(std::uint64_t epoch) const {
  std::vector<std::uint64_t> v(dataset_size);
  for (std::uint64_t i = 0; i < dataset_size; ++i) v[i] = i;
  if (!shuffle || dataset_size < 2) return v;
  SampleRng rng(SampleKey{seed, epoch, kShuffleIndex}, kShuffleStream);
  for (std::uint64_t i = dataset_size - 1; i > 0; --i) {
    const auto j = static_cast<std::uint64_t>(rng.randint(0, static_cast<std::int64_t>(i) + 1));
    std::swap(v[i], v[j]);
  }
  return v;
}

std::vector<std::vector<std::uint64_t>> EpochPlan::batches(std::uint64_t epoch) const {
  if (world == 0 || rank >= world || batch_size == 0) {
    throw_error(Errc::kInvalidArgument, "EpochPlan: need rank < world and batch_size > 0");
  }
  std::vector<std::uint64_t> all = order(epoch);
  // DistributedSampler: cut to, or pad up to, a multiple of world.
  if (drop_last) {
    all.resize(dataset_size / world * world);
  } else if (!all.empty()) {
    const std::size_t total = (dataset_size + world - 1) / world * world;
    for (std::size_t i = 0; all.size() < total; ++i) all.push_back(all[i % dataset_size]);
  }
  std::vector<std::uint64_t> mine;
  for (std::size_t i = rank; i < all.size(); i += world) mine.push_back(all[i]);
  std::vector<std::vector<std::uint64_t>> out;
  for (std::size_t b = 0; b < mine.size(); b += batch_size) {
    const std::size_t end = std::min(mine.size(), b + batch_size);
    if (drop_last && end - b < batch_size) break;
    out.emplace_back(mine.begin() + static_cast<std::ptrdiff_t>(b), mine.begin() + static_cast<std::ptrdiff_t>(end));
  }
  return out;
}

std::size_t EpochPlan::batch_count() const {
  if (world == 0 || batch_size == 0) return 0;
  const std::uint64_t per_rank = drop_last ? dataset_size / world : (dataset_size + world - 1) / world;
  return drop_last ? per_rank / batch_size : (per_rank + batch_size - 1) / batch_size;
}

}  // namespace dlop::offload
