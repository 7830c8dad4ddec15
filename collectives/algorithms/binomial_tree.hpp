// A binomial tree over the ranks of a group, rooted at any rank (private to
// the rooted algorithms: broadcast, reduce, gather and scatter "binomial").
//
// Ranks are renumbered relative to the root, vrank = (rank - root) mod n, so
// the root is vrank 0. The parent of vrank v > 0 is v with its lowest set bit
// cleared; its children are v + m for every power of two m below that bit
// (below n at the root) with v + m < n. The subtree of v covers the vranks
// [v, v + subtree_size(v)), contiguous in vrank order.
#pragma once

#include <algorithm>
#include <vector>

namespace dlop::coll {

class BinomialTree {
 public:
  BinomialTree(int n, int root, int rank) : n_(n), root_(root), vrank_((rank - root + n) % n) {}

  int size() const { return n_; }
  int vrank() const { return vrank_; }
  bool is_root() const { return vrank_ == 0; }
  int to_rank(int vrank) const { return (vrank + root_) % n_; }

  // Group rank of this rank's parent; -1 at the root.
  int parent() const { return is_root() ? -1 : to_rank(vrank_ - lowbit(vrank_)); }
  bool parent_is_root() const { return !is_root() && vrank_ == lowbit(vrank_); }

  // Number of vranks in the subtree of `vrank`.
  int subtree_size(int vrank) const { return vrank == 0 ? n_ : std::min(lowbit(vrank), n_ - vrank); }

  // Offsets m of this rank's children (child vrank = vrank() + m), ascending:
  // the smallest subtree first (reverse them for the largest first).
  std::vector<int> child_offsets() const {
    std::vector<int> offsets;
    const int limit = is_root() ? n_ : lowbit(vrank_);
    for (int m = 1; m < limit && vrank_ + m < n_; m <<= 1) offsets.push_back(m);
    return offsets;
  }

  // The blocks of ranks [start, start + len) in vrank order starting at vrank
  // `start`, as up to two runs of consecutive group ranks: the run from
  // to_rank(start), and (when it wraps past rank n - 1) a second from rank 0.
  struct Runs {
    int first_rank, first_len, second_len;  // the second run starts at rank 0
  };
  Runs runs(int start, int len) const {
    const int first_rank = to_rank(start);
    const int first_len = std::min(len, n_ - first_rank);
    return {first_rank, first_len, len - first_len};
  }

 private:
  static int lowbit(int v) { return v & -v; }

  int n_;
  int root_;
  int vrank_;
};

}  // namespace dlop::coll
