#include "transport/bootstrap.hpp"

#include <fmt/ranges.h>

#include "core/error.hpp"

namespace dlop::transport {
namespace {

using Clock = std::chrono::steady_clock;

std::chrono::milliseconds remaining(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  return std::max(left, std::chrono::milliseconds(0));
}

}  // namespace

Bootstrap::Bootstrap(std::shared_ptr<Store> store, int rank, int size, std::string prefix)
    : store_(std::move(store)), rank_(rank), size_(size), prefix_(std::move(prefix)) {
  if (!store_) throw_error(Errc::kInvalidArgument, "bootstrap needs a store");
  if (size < 1 || rank < 0 || rank >= size) {
    throw_error(Errc::kInvalidArgument, fmt::format("bad rank {} for size {}", rank, size));
  }
}

std::string Bootstrap::scoped(const std::string& key) const { return prefix_ + "/" + key; }

void Bootstrap::set(const std::string& key, const Bytes& value) { store_->set(scoped(key), value); }

Bytes Bootstrap::get(const std::string& key, std::chrono::milliseconds timeout) {
  return store_->get(scoped(key), timeout);
}

std::vector<Bytes> Bootstrap::allgather(const Bytes& mine, std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  const std::string round = fmt::format("allgather/{}/", collective_round_++);
  set(round + std::to_string(rank_), mine);
  std::vector<Bytes> all(size_);
  std::vector<int> missing;
  for (int r = 0; r < size_; ++r) {
    try {
      all[r] = get(round + std::to_string(r), missing.empty() ? remaining(deadline) : std::chrono::milliseconds(0));
    } catch (const Error& e) {
      if (e.code() != Errc::kTimeout) throw;
      missing.push_back(r);
    }
  }
  if (!missing.empty()) {
    throw_error(Errc::kTimeout, fmt::format("bootstrap allgather on rank {} of {}: ranks {} did not arrive within {} ms",
                                            rank_, size_, missing, timeout.count()));
  }
  return all;
}

void Bootstrap::barrier(std::chrono::milliseconds timeout) { allgather({}, timeout); }

}  // namespace dlop::transport
