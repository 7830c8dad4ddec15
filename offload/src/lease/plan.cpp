// EpochPlan: the epoch's order (by sample or by shard) and this rank's share
// of it, with nothing but (seed, epoch) and the shard sizes as input, so
// every rank, every restart and the local fallback agree on which batch
// holds which samples.
#include <algorithm>

#include "core/error.hpp"
#include "core/random.hpp"
#include "offload/lease_manager.hpp"

namespace dlop::offload {
namespace {

// The shuffle's draws use a sample index no real sample has and their own
// stream, so they never coincide with a sample's augmentation draws.
constexpr std::uint64_t kShuffleIndex = ~std::uint64_t{0};
constexpr std::uint64_t kShuffleStream = 0x5348554646ULL;  // "SHUFF"
constexpr std::uint64_t kShardStream = 0x5348415244ULL;    // "SHARD"

// 0 .. n-1, shuffled (Fisher-Yates) by (seed, epoch) on `stream` when asked.
std::vector<std::uint64_t> permutation(std::uint64_t n, bool shuffle, std::uint64_t seed, std::uint64_t epoch,
                                       std::uint64_t stream) {
  std::vector<std::uint64_t> v(n);
  for (std::uint64_t i = 0; i < n; ++i) v[i] = i;
  if (!shuffle || n < 2) return v;
  SampleRng rng(SampleKey{seed, epoch, kShuffleIndex}, stream);
  for (std::uint64_t i = n - 1; i > 0; --i) {
    const auto j = static_cast<std::uint64_t>(rng.randint(0, static_cast<std::int64_t>(i) + 1));
    std::swap(v[i], v[j]);
  }
  return v;
}

}  // namespace

std::vector<std::uint64_t> EpochPlan::order(std::uint64_t epoch) const {
  if (shard_sizes.empty()) return permutation(dataset_size, shuffle, seed, epoch, kShuffleStream);
  std::vector<std::uint64_t> first(shard_sizes.size());  // each shard's first sample
  std::uint64_t total = 0;
  for (std::size_t k = 0; k < shard_sizes.size(); ++k) {
    first[k] = total;
    total += shard_sizes[k];
  }
  if (total != dataset_size) {
    throw_error(Errc::kInvalidArgument, "EpochPlan: the shards hold " + std::to_string(total) +
                                            " samples, the dataset " + std::to_string(dataset_size));
  }
  std::vector<std::uint64_t> v;
  v.reserve(dataset_size);
  for (const std::uint64_t k : permutation(shard_sizes.size(), shuffle, seed, epoch, kShardStream)) {
    for (std::uint64_t i = 0; i < shard_sizes[k]; ++i) v.push_back(first[k] + i);
  }
  return v;
}

std::vector<std::vector<std::uint64_t>> EpochPlan::batches(std::uint64_t epoch) const {
  if (world == 0 || rank >= world || batch_size == 0) {
    throw_error(Errc::kInvalidArgument, "EpochPlan: need rank < world and batch_size > 0");
  }
  std::vector<std::uint64_t> all = order(epoch);
  if (!shard_sizes.empty()) {
    // Round k holds world batches of batch_size back to back; the last round
    // of a rank share that is not a multiple of batch_size holds world equal
    // parts of what is left (padded as DistributedSampler pads, or cut).
    const std::uint64_t share = drop_last ? dataset_size / world : (dataset_size + world - 1) / world;
    for (std::size_t i = 0; all.size() < share * world; ++i) all.push_back(all[i]);
    std::vector<std::vector<std::uint64_t>> out(batch_count());
    for (std::size_t k = 0; k < out.size(); ++k) {
      const std::uint64_t round = std::uint64_t{k} * batch_size * world;
      const std::uint64_t length = std::min<std::uint64_t>(batch_size, share - std::uint64_t{k} * batch_size);
      const auto from = all.begin() + static_cast<std::ptrdiff_t>(round + rank * length);
      out[k].assign(from, from + static_cast<std::ptrdiff_t>(length));
    }
    return out;
  }
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

std::uint64_t EpochPlan::shards_digest() const {
  if (shard_sizes.empty()) return 0;
  std::uint64_t h = 0xcbf29ce484222325ULL;  // FNV-1a over the sizes' bytes
  for (const std::uint64_t size : shard_sizes) {
    for (int b = 0; b < 8; ++b) h = (h ^ ((size >> (8 * b)) & 0xff)) * 0x100000001b3ULL;
  }
  return h == 0 ? 1 : h;
}

}  // namespace dlop::offload
