// The machine's memory-bandwidth ceiling, measured by dlop-bench itself so
// that a collective's bandwidth can be read against what one core can move.
#pragma once

#include <cstddef>

namespace dlop::bench {

struct MemoryBandwidth {
  double copy_gbps = 0;  // memcpy of one array into another: bytes copied per second (1e9)
  double add_gbps = 0;   // a[i] += b[i] on floats: bytes of a per second
  bool measured() const { return copy_gbps > 0; }
};

// One core, two arrays of `bytes` each, median of `runs`. Runs in a forked
// child, so that the arrays count neither in this process's peak RSS nor in
// its address space; the caller's other threads are left alone.
MemoryBandwidth measure_memory_bandwidth(std::size_t bytes = std::size_t{256} << 20, int runs = 5);

// Bytes of memory traffic per byte of S that one rank of a 2-rank
// shared-memory all-reduce must move at least (docs in anchors.md: read both
// inputs, write the result, with a single-copy scheme): about 3.5.
inline constexpr double kAllreduceTrafficPerByte = 3.5;

// The busbw a 2-rank all-reduce could reach if each rank's core moved memory
// at the copy rate: a copy moves 2 bytes of traffic (read + write) per byte
// copied, so ceiling = 2 * copy_gbps / 3.5 (busbw == algbw for 2 ranks).
inline double allreduce_ceiling_busbw(const MemoryBandwidth& bw) {
  return 2 * bw.copy_gbps / kAllreduceTrafficPerByte;
}

}  // namespace dlop::bench
