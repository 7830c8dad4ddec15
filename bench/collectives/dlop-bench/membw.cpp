#include "membw.hpp"

#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <utility>

#include "core/error.hpp"

namespace dlop::bench {
namespace {

using Clock = std::chrono::steady_clock;

// Only mmap, memcpy and the clock: the child of a threaded process may not
// take locks (malloc's included) that another thread held at the fork.
void* map(std::size_t bytes) {
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  return p == MAP_FAILED ? nullptr : p;
}

// Four floats at a time (SSE2, x86-64's baseline; -O2 would leave it scalar),
// so that the loop is bound by memory rather than by instructions.
__attribute__((noinline)) void add_arrays(float* a, const float* b, std::size_t n) {
  using Float4 = float __attribute__((vector_size(16)));
  std::size_t i = 0;
  for (; i + 4 <= n; i += 4) {
    Float4 x, y;
    std::memcpy(&x, a + i, sizeof(x));
    std::memcpy(&y, b + i, sizeof(y));
    x += y;
    std::memcpy(a + i, &x, sizeof(x));
  }
  for (; i < n; ++i) a[i] += b[i];
}

// The compiler must not drop or merge the timed stores: the clobber says
// memory was read.
template <typename F>
double seconds(F&& f) {
  const auto start = Clock::now();
  f();
  asm volatile("" ::: "memory");
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// In the child: writes {copy, add} medians (GB/s) to fd.
[[noreturn]] void measure_in_child(int fd, std::size_t bytes, int runs) {
  double result[2] = {0, 0};
  void* a = map(bytes);
  void* b = map(bytes);
  constexpr int kMaxRuns = 64;
  if (a != nullptr && b != nullptr && runs <= kMaxRuns) {
    std::memset(a, 1, bytes);  // touch every page before timing
    std::memset(b, 2, bytes);
    double copy[kMaxRuns], add[kMaxRuns];
    for (int r = 0; r < runs; ++r) {
      copy[r] = static_cast<double>(bytes) / seconds([&] { std::memcpy(a, b, bytes); }) / 1e9;
      std::memset(a, 0, bytes);  // float zeros: a[i] += b[i] stays finite
      add[r] = static_cast<double>(bytes) /
               seconds([&] { add_arrays(static_cast<float*>(a), static_cast<const float*>(b), bytes / sizeof(float)); }) /
               1e9;
    }
    // Medians by insertion sort (no allocation).
    for (double* v : {copy, add}) {
      for (int i = 1; i < runs; ++i) {
        for (int j = i; j > 0 && v[j] < v[j - 1]; --j) std::swap(v[j], v[j - 1]);
      }
    }
    result[0] = runs % 2 == 1 ? copy[runs / 2] : (copy[runs / 2 - 1] + copy[runs / 2]) / 2;
    result[1] = runs % 2 == 1 ? add[runs / 2] : (add[runs / 2 - 1] + add[runs / 2]) / 2;
  }
  const bool ok = ::write(fd, result, sizeof(result)) == static_cast<ssize_t>(sizeof(result));
  ::_exit(ok ? 0 : 1);
}

}  // namespace

MemoryBandwidth measure_memory_bandwidth(std::size_t bytes, int runs) {
  int fds[2];
  if (::pipe(fds) != 0) throw_errno("pipe");
  const pid_t pid = ::fork();
  if (pid < 0) throw_errno("fork");
  if (pid == 0) {
    ::close(fds[0]);
    measure_in_child(fds[1], bytes, runs);
  }
  ::close(fds[1]);
  double result[2] = {0, 0};
  const ssize_t got = ::read(fds[0], result, sizeof(result));
  ::close(fds[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  if (got != static_cast<ssize_t>(sizeof(result))) {
    throw_error(Errc::kSystem, "the memory-bandwidth child did not report (out of memory?)");
  }
  return {result[0], result[1]};
}

}  // namespace dlop::bench
