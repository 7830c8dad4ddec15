#include "transport/session.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <sys/random.h>

#include <algorithm>
#include <cerrno>
#include <optional>
#include <sstream>
#include <thread>
#include <vector>

#include "core/error.hpp"
#include "core/log.hpp"

namespace dlop::transport {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// How long a rank waits for its members before it looks at `leader` again,
// growing from the first to the last while nothing changes.
constexpr milliseconds kFirstLook{5};
constexpr milliseconds kLastLook{200};

milliseconds remaining(Clock::time_point deadline) {
  return std::max(std::chrono::duration_cast<milliseconds>(deadline - Clock::now()), milliseconds(0));
}

std::string random_id() {
  std::uint64_t value = 0;
  auto* bytes = reinterpret_cast<unsigned char*>(&value);
  std::size_t got = 0;
  while (got < sizeof value) {
    const ssize_t n = ::getrandom(bytes + got, sizeof value - got, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw_errno("getrandom");
    }
    got += static_cast<std::size_t>(n);
  }
  return fmt::format("{:016x}", value);
}

std::string text(const Bytes& bytes) { return std::string(bytes.begin(), bytes.end()); }
Bytes bytes(const std::string& text) { return Bytes(text.begin(), text.end()); }

std::optional<Bytes> try_get(Store& store, const std::string& key, milliseconds wait) {
  try {
    return store.get(key, std::max(wait, milliseconds(1)));
  } catch (const Error& e) {
    if (e.code() != Errc::kTimeout) throw;
    return std::nullopt;
  }
}

// Whether members (rank 0's list for ranks 1..size-1) admit `rank` with `nonce`.
bool admits(const Bytes& members, int rank, int size, const std::string& nonce) {
  std::istringstream in(text(members));
  std::vector<std::string> nonces;
  for (std::string one; in >> one;) nonces.push_back(one);
  return nonces.size() == static_cast<std::size_t>(size - 1) && nonces[static_cast<std::size_t>(rank - 1)] == nonce;
}

std::string lead(Store& store, const std::string& ns, int size, milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  const std::string id = random_id();
  store.set(ns + "leader", bytes(id));
  std::string members;
  std::vector<int> missing;
  for (int r = 1; r < size; ++r) {
    const auto wait = missing.empty() ? remaining(deadline) : milliseconds(1);
    if (auto nonce = try_get(store, fmt::format("{}{}/join/{}", ns, id, r), wait)) {
      members += text(*nonce) + " ";
    } else {
      missing.push_back(r);
    }
  }
  if (!missing.empty()) {
    throw_error(Errc::kTimeout, fmt::format("session {}: ranks {} of {} did not join within {} ms", id, missing, size,
                                            timeout.count()));
  }
  store.set(fmt::format("{}{}/members", ns, id), bytes(members));
  return id;
}

std::string join(Store& store, const std::string& ns, int rank, int size, milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  const std::string nonce = random_id();
  std::string joined;         // the leader id this rank last joined
  bool joined_stale = false;  // its members do not list this rank: an earlier attempt's
  auto look = kFirstLook;
  while (true) {
    const auto leader = try_get(store, ns + "leader", remaining(deadline));
    if (!leader) {
      throw_error(Errc::kTimeout, fmt::format("rank {} of {}: rank 0 published no session id within {} ms", rank,
                                              size, timeout.count()));
    }
    if (text(*leader) != joined) {
      if (!joined.empty()) log().debug("rank {}: session id {} replaces {}", rank, text(*leader), joined);
      joined = text(*leader);
      joined_stale = false;
      store.set(fmt::format("{}{}/join/{}", ns, joined, rank), bytes(nonce));
      look = kFirstLook;
    }
    if (auto members = try_get(store, fmt::format("{}{}/members", ns, joined), std::min(look, remaining(deadline)))) {
      if (admits(*members, rank, size, nonce)) return joined;
      // An earlier attempt's session: wait for this attempt's rank 0 to replace it.
      joined_stale = true;
      std::this_thread::sleep_for(std::min(look, remaining(deadline)));
    }
    if (remaining(deadline).count() == 0) {
      throw_error(Errc::kTimeout,
                  fmt::format("rank {} of {}: not admitted to a session within {} ms (the last session id read, {}, "
                              "{})",
                              rank, size, timeout.count(), joined,
                              joined_stale ? "is an earlier attempt's" : "was not completed by its rank 0"));
    }
    look = std::min(look * 2, kLastLook);
  }
}

}  // namespace

std::string agree_session(Store& store, const std::string& prefix, int rank, int size, milliseconds timeout) {
  if (size < 1 || rank < 0 || rank >= size) {
    throw_error(Errc::kInvalidArgument, fmt::format("session: bad rank {} for size {}", rank, size));
  }
  const std::string ns = prefix + "/session/";
  return rank == 0 ? lead(store, ns, size, timeout) : join(store, ns, rank, size, timeout);
}

}  // namespace dlop::transport
