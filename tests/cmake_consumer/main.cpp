// A program built against the installed dlop package: two ranks (forked here,
// bootstrapped through a FileStore in a fresh directory) all-reduce over
// dlop::sched::Communicator and check every element against a reference sum.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "scheduler/communicator.hpp"
#include "transport/file_store.hpp"

namespace {

constexpr int kRanks = 2;

// What rank r contributes at element i: small integers, so float sums are exact.
double value(int rank, std::size_t i) { return static_cast<double>((i * 7 + static_cast<std::size_t>(rank) * 13) % 1000); }

int run_rank(const std::string& dir, int rank) {
  dlop::transport::Bootstrap bootstrap(std::make_shared<dlop::transport::FileStore>(dir), rank, kRanks);
  auto comm = dlop::sched::Communicator::create(bootstrap);
  int bad = 0;
  for (const std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{1001}, std::size_t{1} << 18}) {
    std::vector<float> f(count);
    std::vector<std::int64_t> n(count);
    for (std::size_t i = 0; i < count; ++i) {
      f[i] = static_cast<float>(value(rank, i));
      n[i] = static_cast<std::int64_t>(value(rank, i)) - 500;
    }
    comm->allreduce(f.data(), f.data(), count, dlop::coll::DataType::kFloat32, dlop::coll::ReduceOp::kSum).wait();
    comm->allreduce(n.data(), n.data(), count, dlop::coll::DataType::kInt64, dlop::coll::ReduceOp::kMax).wait();
    for (std::size_t i = 0; i < count; ++i) {
      double sum = 0;
      std::int64_t max = INT64_MIN;
      for (int r = 0; r < kRanks; ++r) {
        sum += value(r, i);
        max = std::max(max, static_cast<std::int64_t>(value(r, i)) - 500);
      }
      if (f[i] != static_cast<float>(sum) || n[i] != max) {
        if (bad++ < 5) {
          std::fprintf(stderr, "rank %d, count %zu, element %zu: sum %g (want %g), max %lld (want %lld)\n", rank,
                       count, i, static_cast<double>(f[i]), sum, static_cast<long long>(n[i]),
                       static_cast<long long>(max));
        }
      }
    }
  }
  return bad == 0 ? 0 : 1;
}

}  // namespace

int main() {
  std::string dir = (std::filesystem::temp_directory_path() / "dlop-consumer-XXXXXX").string();
  if (::mkdtemp(dir.data()) == nullptr) return 2;
  std::vector<pid_t> pids;
  for (int rank = 0; rank < kRanks; ++rank) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::alarm(120);  // a hang fails instead of blocking the test
      int code = 3;
      try {
        code = run_rank(dir, rank);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "rank %d: %s\n", rank, e.what());
      }
      std::fflush(nullptr);
      std::_Exit(code);
    }
    pids.push_back(pid);
  }
  int failed = 0;
  for (const pid_t pid : pids) {
    int status = 0;
    ::waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) ++failed;
  }
  std::filesystem::remove_all(dir);
  std::printf("dlop_consumer: %d of %d ranks %s\n", failed == 0 ? kRanks : failed, kRanks, failed == 0 ? "passed" : "failed");
  return failed == 0 ? 0 : 1;
}
