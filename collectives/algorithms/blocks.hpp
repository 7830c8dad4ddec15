// Block and chunk arithmetic shared by the allreduce family (private to
// collectives/algorithms). Sizes are in elements unless a name says bytes.
//
//   block    one rank's share of a vector: an even partition of `count` into
//            n blocks (allreduce), or n blocks of given counts (reduce_scatter,
//            allgather and their v-variants), laid out one after another.
//   chunk    a piece of at most `chunk` elements of a block or of a vector;
//            chunk k covers [k * chunk, min((k + 1) * chunk, size)).
//   fold     how a group of n ranks that is not a power of two runs an
//            algorithm made for p = 2^k ranks: see PowerOfTwoFold.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <numeric>
#include <vector>

namespace dlop::coll {

// Offset of block i when `count` elements are split into `parts` blocks whose
// sizes differ by at most one (the first count % parts blocks are larger).
inline std::size_t even_block_offset(std::size_t count, std::size_t parts, std::size_t i) {
  const std::size_t base = count / parts;
  const std::size_t extra = count % parts;
  return i * base + std::min(i, extra);
}

// Blocks laid out one after another, in rank order.
struct BlockLayout {
  std::vector<std::size_t> offset;  // elements
  std::vector<std::size_t> count;   // elements

  static BlockLayout from_counts(const std::vector<std::size_t>& counts) {
    BlockLayout layout;
    std::size_t at = 0;
    for (const std::size_t c : counts) {
      layout.offset.push_back(at);
      layout.count.push_back(c);
      at += c;
    }
    return layout;
  }
  static BlockLayout uniform(std::size_t block, int parts) {
    return from_counts(std::vector<std::size_t>(static_cast<std::size_t>(parts), block));
  }
  static BlockLayout even(std::size_t count, int parts) {
    std::vector<std::size_t> counts;
    const auto p = static_cast<std::size_t>(parts);
    for (std::size_t i = 0; i < p; ++i) {
      counts.push_back(even_block_offset(count, p, i + 1) - even_block_offset(count, p, i));
    }
    return from_counts(counts);
  }

  std::size_t largest() const { return count.empty() ? 0 : *std::max_element(count.begin(), count.end()); }
  std::size_t total() const { return std::accumulate(count.begin(), count.end(), std::size_t{0}); }
};

struct Span {
  std::size_t offset = 0;  // elements from the start of what was cut
  std::size_t count = 0;   // elements
};

// Chunk k of `size` elements cut into chunks of at most `chunk` (empty past the end).
inline Span chunk_of(std::size_t size, std::size_t chunk, std::size_t k) {
  const std::size_t begin = std::min(size, k * chunk);
  return {begin, std::min(size, begin + chunk) - begin};
}
inline std::size_t chunks_in(std::size_t size, std::size_t chunk) { return (size + chunk - 1) / chunk; }

// Elements per chunk of about `chunk_bytes` (at least one).
inline std::size_t chunk_elements(std::size_t chunk_bytes, std::size_t element_size) {
  return std::max<std::size_t>(1, chunk_bytes / element_size);
}

// a mod n in [0, n) for any sign of a.
inline int ring_index(int a, int n) { return ((a % n) + n) % n; }

// Pointer to element `index` of a buffer of `element_size`-byte elements.
inline std::byte* element_at(void* base, std::size_t index, std::size_t element_size) {
  return static_cast<std::byte*>(base) + index * element_size;
}
inline const std::byte* element_at(const void* base, std::size_t index, std::size_t element_size) {
  return static_cast<const std::byte*>(base) + index * element_size;
}

// Copies bytes unless source and destination are the same (overlap allowed).
inline void move_bytes(void* to, const void* from, std::size_t bytes) {
  if (bytes != 0 && to != from) std::memmove(to, from, bytes);
}

// The usual fold-in of a group of n ranks onto p = 2^k <= n (the largest):
// with rem = n - p, ranks 2i and 2i + 1 for i < rem form pairs; the even one
// ("extra") hands its data to the odd one before the algorithm and gets the
// result back after it. The p remaining ranks are renumbered 0..p-1
// ("virtual ranks"): the odd rank 2i + 1 becomes i, rank r >= 2 rem becomes
// r - rem. Reductions combine data in a fixed order (lower virtual rank, or
// the extra rank, on the left), so every rank computes bitwise the same.
class PowerOfTwoFold {
 public:
  explicit PowerOfTwoFold(int n) {
    while (p_ * 2 <= n) {
      p_ *= 2;
      ++levels_;
    }
    rem_ = n - p_;
  }

  int p() const { return p_; }
  int levels() const { return levels_; }  // log2(p)
  bool is_extra(int rank) const { return rank < 2 * rem_ && rank % 2 == 0; }
  // The odd partner that takes over an extra rank's data.
  bool has_extra(int rank) const { return rank < 2 * rem_ && rank % 2 == 1; }
  // Virtual rank of a rank, -1 for an extra one.
  int vrank(int rank) const {
    if (is_extra(rank)) return -1;
    return rank < 2 * rem_ ? rank / 2 : rank - rem_;
  }
  int rank_of(int vrank) const { return vrank < rem_ ? 2 * vrank + 1 : vrank + rem_; }

 private:
  int p_ = 1;
  int levels_ = 0;
  int rem_ = 0;
};

}  // namespace dlop::coll
