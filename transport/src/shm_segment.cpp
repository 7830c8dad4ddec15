#include "transport/shm_segment.hpp"

#include <fcntl.h>
#include <fmt/ranges.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <limits>
#include <optional>
#include <sstream>
#include <thread>
#include <utility>

#include "core/error.hpp"
#include "core/log.hpp"

namespace dlop::transport {
namespace {

using Clock = std::chrono::steady_clock;

constexpr std::uint64_t kMagic = 0x314d48535f504f4cULL;  // "LOP_SHM1" little-endian
constexpr std::uint32_t kVersion = 1;
constexpr const char* kShmDir = "/dev/shm";
// A file too small for a header is a creator between shm_open and its first
// write; after this long it is a creator that died there.
constexpr auto kHeaderlessGrace = std::chrono::seconds(5);

// The first kHeaderBytes of every segment. The creator writes it whole before
// sizing the segment, so a file of at least this size has its identity fields;
// `ready` flips to 1 last (accessed through std::atomic_ref). Keep magic and
// the creator's identity at these offsets in every version.
struct Header {
  std::uint64_t magic;
  std::uint32_t version;
  std::int32_t creator_pid;
  std::uint64_t creator_start_time;
  std::uint64_t pid_namespace;  // inode of the creator's /proc/self/ns/pid
  std::uint64_t header_bytes;
  std::uint64_t user_bytes;
  std::uint64_t ready;
  std::uint64_t reserved;
};
static_assert(sizeof(Header) == ShmSegment::kHeaderBytes);
static_assert(std::atomic_ref<std::uint64_t>::is_always_lock_free);

struct Fd {
  int fd = -1;
  Fd() = default;
  explicit Fd(int f) : fd(f) {}
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

std::uint64_t own_pid_namespace() {
  static const std::uint64_t ns = []() -> std::uint64_t {
    char link[64] = {};
    if (::readlink("/proc/self/ns/pid", link, sizeof(link) - 1) <= 0) return 0;
    const char* digits = std::strchr(link, '[');
    return digits == nullptr ? 0 : std::strtoull(digits + 1, nullptr, 10);
  }();
  return ns;
}

// Whether this process can judge the creator's liveness: same pid namespace,
// and a start time was known (without /proc every creator would look dead).
bool can_judge(const Header& h) {
  const bool same_namespace =
      h.pid_namespace == 0 || own_pid_namespace() == 0 || h.pid_namespace == own_pid_namespace();
  return same_namespace && h.creator_start_time != 0;
}

ProcessId creator_of(const Header& h) { return ProcessId{static_cast<pid_t>(h.creator_pid), h.creator_start_time}; }

std::atomic_ref<std::uint64_t> ready_flag(std::byte* base) {
  return std::atomic_ref<std::uint64_t>(static_cast<Header*>(static_cast<void*>(base))->ready);
}

void validate_name(const std::string& name) {
  if (name.empty() || name.size() > 200 || name.find_first_of(std::string("/\0", 2)) != std::string::npos) {
    throw_error(Errc::kInvalidArgument,
                fmt::format("bad shm segment name '{}': need 1 to 200 characters, no '/'", name));
  }
}

std::string shm_name(const std::string& name) { return std::string("/") + ShmSegment::kPrefix + name; }

// What a dlop-* file in /dev/shm is, judged from its header and its creator.
enum class State { kGone, kLive, kDead, kHeaderlessYoung, kHeaderlessOld, kForeign, kUnjudgeable };

struct Inspection {
  State state = State::kGone;
  Header header{};
  dev_t device = 0;
  ino_t inode = 0;
};

Inspection inspect(const std::string& path) {
  Inspection found;
  const Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK));
  struct stat st {};
  if (fd.fd < 0 || ::fstat(fd.fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    found.state = fd.fd < 0 && errno == ENOENT ? State::kGone : State::kForeign;  // e.g. another user's
    return found;
  }
  found.device = st.st_dev;
  found.inode = st.st_ino;
  if (static_cast<std::size_t>(st.st_size) < sizeof(Header)) {
    const auto age = std::chrono::system_clock::now() - std::chrono::system_clock::from_time_t(st.st_mtim.tv_sec);
    found.state = age > kHeaderlessGrace ? State::kHeaderlessOld : State::kHeaderlessYoung;
  } else if (::pread(fd.fd, &found.header, sizeof(Header), 0) != static_cast<ssize_t>(sizeof(Header)) ||
             found.header.magic != kMagic) {
    found.state = State::kForeign;
  } else if (!can_judge(found.header)) {
    found.state = State::kUnjudgeable;
  } else {
    found.state = creator_of(found.header).alive() ? State::kLive : State::kDead;
  }
  return found;
}

// Unlinks path if it is still the file (device, inode): never a newer segment
// that reuses the name. False if it is gone or replaced; failures are logged.
bool remove_if_same(const std::string& path, dev_t device, ino_t inode) noexcept {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0 || st.st_dev != device || st.st_ino != inode) return false;
  if (::unlink(path.c_str()) == 0) return true;
  if (errno != ENOENT) log().warn("cannot unlink shm segment {}: {}", path, std::strerror(errno));
  return false;
}

std::byte* map_segment(int fd, std::size_t total, const std::string& path) {
  void* base = ::mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) throw_errno(fmt::format("cannot map {} bytes of shm segment {}", total, path));
  return static_cast<std::byte*>(base);
}

std::chrono::milliseconds remaining(Clock::time_point deadline) {
  return std::max(std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()),
                  std::chrono::milliseconds(0));
}

// create_shared's messages through the bootstrap: "ok <pid> <start time>" or
// "error <what>".
Bytes to_bytes(const std::string& text) { return Bytes(text.begin(), text.end()); }

std::optional<std::string> failure_of(const Bytes& message) {
  const std::string text(message.begin(), message.end());
  if (text.starts_with("ok")) return std::nullopt;
  return text.starts_with("error ") ? text.substr(6) : "(malformed message '" + text + "')";
}

ProcessId creator_in(const Bytes& message) {
  std::istringstream in(std::string(message.begin(), message.end()));
  std::string ok;
  ProcessId id;
  if (!(in >> ok >> id.pid >> id.start_time)) throw_error(Errc::kProtocol, "shm: malformed creator message");
  return id;
}

}  // namespace

std::string ShmSegment::path_of(const std::string& name) { return std::string(kShmDir) + shm_name(name); }

int ShmSegment::remove_stale_segments() {
  int removed = 0;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(kShmDir, ec)) {
    if (!entry.path().filename().string().starts_with(kPrefix)) continue;
    const std::string path = entry.path().string();
    const Inspection found = inspect(path);
    if (found.state != State::kDead && found.state != State::kHeaderlessOld) continue;
    if (!remove_if_same(path, found.device, found.inode)) continue;
    ++removed;
    if (found.state == State::kDead) {
      log().info("removed stale shm segment {} ({} bytes): its creator pid {} is dead", path,
                 found.header.user_bytes, found.header.creator_pid);
    } else {
      log().info("removed stale shm segment {}: never initialised", path);
    }
  }
  if (ec) log().warn("cannot scan {} for stale shm segments: {}", kShmDir, ec.message());
  return removed;
}

ShmSegment ShmSegment::create(const std::string& name, std::size_t bytes) {
  validate_name(name);
  if (bytes == 0 || bytes > static_cast<std::size_t>(std::numeric_limits<off_t>::max()) - kHeaderBytes) {
    throw_error(Errc::kInvalidArgument, fmt::format("shm segment '{}': bad size {} bytes", name, bytes));
  }
  remove_stale_segments();
  const std::string path = path_of(name);

  Fd fd;
  for (int attempt = 0; fd.fd < 0; ++attempt) {
    fd.fd = ::shm_open(shm_name(name).c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd.fd >= 0) break;
    if (errno != EEXIST) throw_errno(fmt::format("cannot create shm segment {}", path));
    const Inspection found = inspect(path);
    std::string collision;
    const int pid = found.header.creator_pid;
    switch (found.state) {
      case State::kLive: collision = fmt::format("its creator pid {} is alive (name collision)", pid); break;
      case State::kUnjudgeable:
        collision = fmt::format("its creator pid {} is in another pid namespace (or its liveness unknown)", pid);
        break;
      case State::kForeign: collision = "it is not a dlop segment (or not readable)"; break;
      case State::kHeaderlessYoung: collision = "another process is creating it right now (name collision)"; break;
      case State::kDead:
      case State::kHeaderlessOld:
        if (remove_if_same(path, found.device, found.inode)) log().info("replaced stale shm segment {}", path);
        break;
      case State::kGone: break;
    }
    if (collision.empty() && attempt >= 3) collision = "it keeps reappearing";
    if (!collision.empty()) {
      throw_error(Errc::kInvalidArgument,
                  fmt::format("cannot create shm segment {}: it exists and {}", path, collision));
    }
  }

  struct stat st {};
  if (::fstat(fd.fd, &st) != 0) throw_errno(fmt::format("cannot stat {}", path));  // left for the stale scan
  try {  // until the segment is complete, a failure removes it again
    const ProcessId self = ProcessId::self();
    const Header header{kMagic, kVersion, static_cast<std::int32_t>(self.pid), self.start_time, own_pid_namespace(),
                        kHeaderBytes, bytes, 0, 0};
    if (::pwrite(fd.fd, &header, sizeof(header), 0) != static_cast<ssize_t>(sizeof(header))) {
      throw_errno(fmt::format("cannot write the header of shm segment {}", path));
    }
    const std::size_t total = kHeaderBytes + bytes;
    // Allocate every page now: a full /dev/shm fails here, not with SIGBUS on first touch.
    int err = 0;
    do {
      err = ::posix_fallocate(fd.fd, 0, static_cast<off_t>(total));
    } while (err == EINTR);
    if (err != 0) {
      throw_error(Errc::kSystem, fmt::format("cannot allocate {} bytes for shm segment {} (is {} full?): {}", total,
                                             path, kShmDir, std::strerror(err)));
    }
    ShmSegment segment(name, map_segment(fd.fd, total, path), bytes, self, true, st.st_dev, st.st_ino);
    ready_flag(segment.base_).store(1, std::memory_order_release);
    log().debug("created shm segment {} of {} bytes", path, bytes);
    return segment;
  } catch (...) {
    remove_if_same(path, st.st_dev, st.st_ino);
    throw;
  }
}

ShmSegment ShmSegment::open(const std::string& name, std::chrono::milliseconds timeout) {
  validate_name(name);
  const std::string path = path_of(name);
  const auto deadline = Clock::now() + timeout;
  auto pause = std::chrono::microseconds(100);
  std::string waiting_for;
  while (true) {
    const Fd fd(::shm_open(shm_name(name).c_str(), O_RDWR | O_CLOEXEC, 0));
    struct stat st {};
    Header h{};
    if (fd.fd < 0) {
      if (errno != ENOENT) throw_errno(fmt::format("cannot open shm segment {}", path));
      waiting_for = "it does not exist";
    } else if (::fstat(fd.fd, &st) != 0) {
      throw_errno(fmt::format("cannot stat {}", path));
    } else if (static_cast<std::size_t>(st.st_size) < sizeof(Header)) {
      waiting_for = "its creator has not written the header";
    } else if (::pread(fd.fd, &h, sizeof(h), 0) != static_cast<ssize_t>(sizeof(h))) {
      throw_errno(fmt::format("cannot read the header of {}", path));
    } else if (h.magic != kMagic) {
      throw_error(Errc::kProtocol, fmt::format("{} is not a dlop shm segment (bad magic)", path));
    } else if (h.version != kVersion || h.header_bytes != kHeaderBytes) {
      throw_error(Errc::kProtocol, fmt::format("{} has version {} (header {} bytes); this build reads version {}",
                                               path, h.version, h.header_bytes, kVersion));
    } else if (can_judge(h) && !creator_of(h).alive()) {
      waiting_for = fmt::format("it is stale: its creator pid {} is dead", h.creator_pid);
    } else if (static_cast<std::uint64_t>(st.st_size) < kHeaderBytes + h.user_bytes) {
      waiting_for = "its creator has not allocated it";
    } else if (static_cast<std::uint64_t>(st.st_size) != kHeaderBytes + h.user_bytes) {
      throw_error(Errc::kProtocol, fmt::format("{} is {} bytes but its header says {} + {}", path, st.st_size,
                                               kHeaderBytes, h.user_bytes));
    } else {
      ShmSegment segment(name, map_segment(fd.fd, kHeaderBytes + h.user_bytes, path), h.user_bytes, creator_of(h),
                         false, st.st_dev, st.st_ino);
      if (ready_flag(segment.base_).load(std::memory_order_acquire) == 1) {
        log().debug("opened shm segment {} of {} bytes", path, h.user_bytes);
        return segment;
      }
      waiting_for = "its creator has not marked it ready";
    }  // the segment, if any, is unmapped here: try again
    if (Clock::now() >= deadline) {
      throw_error(Errc::kTimeout, fmt::format("shm segment '{}' ({}) not ready within {} ms: {}", name, path,
                                              timeout.count(), waiting_for));
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(10'000));
  }
}

ShmSegment ShmSegment::create_shared(Bootstrap& bootstrap, const std::vector<int>& local_ranks,
                                     const std::string& name, std::size_t bytes, std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  std::vector<int> sorted = local_ranks;
  std::sort(sorted.begin(), sorted.end());
  if (sorted.empty() || sorted.front() < 0 || sorted.back() >= bootstrap.size() ||
      std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end() ||
      !std::binary_search(sorted.begin(), sorted.end(), bootstrap.rank())) {
    throw_error(Errc::kInvalidArgument, fmt::format("shm segment '{}': bad local ranks {} for rank {} of {}", name,
                                                    local_ranks, bootstrap.rank(), bootstrap.size()));
  }
  const int creator_rank = local_ranks.front();
  const std::string created_key = fmt::format("shm/{}/created", name);
  const auto mapped_key = [&](int rank) { return fmt::format("shm/{}/mapped/{}", name, rank); };

  if (bootstrap.rank() == creator_rank) {
    std::optional<ShmSegment> segment;
    try {
      segment.emplace(create(name, bytes));
    } catch (const std::exception& e) {
      bootstrap.set(created_key, to_bytes(std::string("error ") + e.what()));
      throw;
    }
    const ProcessId self = segment->creator();
    bootstrap.set(created_key, to_bytes(fmt::format("ok {} {}", self.pid, self.start_time)));
    std::vector<int> missing;
    for (const int rank : local_ranks) {
      if (rank == creator_rank) continue;
      try {
        const auto wait = missing.empty() ? remaining(deadline) : std::chrono::milliseconds(0);
        if (auto failure = failure_of(bootstrap.get(mapped_key(rank), wait))) {
          throw_error(Errc::kTransport,
                      fmt::format("rank {} could not map shm segment '{}': {}", rank, name, *failure));
        }
      } catch (const Error& e) {
        if (e.code() != Errc::kTimeout) throw;
        missing.push_back(rank);
      }
    }
    if (!missing.empty()) {
      throw_error(Errc::kTimeout, fmt::format("shm segment '{}': local ranks {} did not map it within {} ms", name,
                                              missing, timeout.count()));
    }
    segment->unlink();
    return std::move(*segment);
  }

  Bytes created;
  try {
    created = bootstrap.get(created_key, timeout);
  } catch (const Error& e) {
    if (e.code() != Errc::kTimeout) throw;
    throw_error(Errc::kTimeout, fmt::format("shm segment '{}': creator rank {} did not create it within {} ms", name,
                                            creator_rank, timeout.count()));
  }
  if (auto failure = failure_of(created)) {
    throw_error(Errc::kTransport,
                fmt::format("creator rank {} could not create shm segment '{}': {}", creator_rank, name, *failure));
  }
  try {
    const ProcessId creator = creator_in(created);
    ShmSegment segment = open(name, remaining(deadline));
    if (!(segment.creator() == creator)) {
      throw_error(Errc::kProtocol, fmt::format("shm segment '{}' was created by pid {}, not by rank {} (pid {})", name,
                                               segment.creator().pid, creator_rank, creator.pid));
    }
    bootstrap.set(mapped_key(bootstrap.rank()), to_bytes("ok"));
    return segment;
  } catch (const std::exception& e) {
    bootstrap.set(mapped_key(bootstrap.rank()), to_bytes(std::string("error ") + e.what()));
    throw;
  }
}

ShmSegment::ShmSegment(std::string name, std::byte* base, std::size_t user_bytes, ProcessId creator, bool is_creator,
                       dev_t device, ino_t inode)
    : name_(std::move(name)),
      base_(base),
      user_bytes_(user_bytes),
      creator_(creator),
      is_creator_(is_creator),
      device_(device),
      inode_(inode) {}

ShmSegment::ShmSegment(ShmSegment&& other) noexcept { *this = std::move(other); }

ShmSegment& ShmSegment::operator=(ShmSegment&& other) noexcept {
  if (this != &other) {
    release();
    name_ = std::move(other.name_);
    base_ = std::exchange(other.base_, nullptr);
    user_bytes_ = std::exchange(other.user_bytes_, 0);
    creator_ = other.creator_;
    is_creator_ = std::exchange(other.is_creator_, false);
    unlinked_ = other.unlinked_;
    device_ = other.device_;
    inode_ = other.inode_;
  }
  return *this;
}

ShmSegment::~ShmSegment() { release(); }

void ShmSegment::release() noexcept {
  if (base_ == nullptr) return;
  if (is_creator_) unlink();
  ::munmap(base_, kHeaderBytes + user_bytes_);
  base_ = nullptr;
}

void ShmSegment::unlink() {
  if (unlinked_ || base_ == nullptr) return;
  remove_if_same(path_of(name_), device_, inode_);
  unlinked_ = true;
}

}  // namespace dlop::transport
