// A POSIX shared-memory segment mapped by the ranks of one host: the medium of
// the intra-host collectives. One rank creates it, the others open it; once
// all have mapped it the name is unlinked, so that a crash of anyone leaves
// nothing behind in /dev/shm while the mappings stay valid.
//
// Segments live at /dev/shm/dlop-<name>. The first 64 bytes hold a header
// (magic, version, sizes, the creator's ProcessId and a "ready" flag set last
// with release ordering); the user area follows, cache-line aligned. Segments
// left behind by a creator that died before unlinking are found by their dead
// creator and removed by the next create() on the host (and by each engine as
// it starts, scheduler/src/engine.cpp).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstddef>
#include <string>
#include <vector>

#include "core/process.hpp"
#include "transport/bootstrap.hpp"

namespace dlop::transport {

class ShmSegment {
 public:
  // Prefix of every segment's file name under /dev/shm.
  static constexpr const char* kPrefix = "dlop-";
  // Bytes before the user area; the user area is aligned to this too.
  static constexpr std::size_t kHeaderBytes = 64;

  // Creates /dev/shm/dlop-<name> with a user area of `bytes` (> 0) and maps it.
  // Removes stale dlop segments first (see remove_stale_segments). Throws
  // kInvalidArgument for a bad name or size, or when the name is held by a live
  // creator (a name collision); kSystem when /dev/shm cannot hold the segment.
  // A segment of that name whose creator is dead is replaced.
  static ShmSegment create(const std::string& name, std::size_t bytes);

  // Maps a segment another process creates, waiting up to `timeout` until it
  // exists and is initialised. Segments whose creator is dead are ignored (a
  // new creator will replace them). Throws kTimeout naming the segment,
  // kProtocol when the file is not a dlop segment of this version.
  static ShmSegment open(const std::string& name, std::chrono::milliseconds timeout);

  // The whole dance over a bootstrap: local_ranks.front() creates, the other
  // local ranks open, each reports through the bootstrap store that it mapped
  // the segment, and the creator unlinks it once all did; on the creator the
  // segment is unlinked when this returns. Every rank of local_ranks calls it
  // with the same arguments. Keys used: "shm/<name>/created" and
  // "shm/<name>/mapped/<rank>", so a name is used once per bootstrap. A failure
  // on one rank is reported to the others instead of leaving them to time out.
  static ShmSegment create_shared(Bootstrap& bootstrap, const std::vector<int>& local_ranks,
                                  const std::string& name, std::size_t bytes,
                                  std::chrono::milliseconds timeout);

  // Removes dlop segments whose creator is no longer alive, and files too small
  // to hold a header that are older than a few seconds. Segments of creators
  // in another pid namespace are left alone (their liveness is unknowable
  // here). Returns how many were removed; each is logged at info.
  static int remove_stale_segments();

  // "/dev/shm/dlop-<name>".
  static std::string path_of(const std::string& name);

  ShmSegment(ShmSegment&& other) noexcept;
  ShmSegment& operator=(ShmSegment&& other) noexcept;
  ShmSegment(const ShmSegment&) = delete;
  ShmSegment& operator=(const ShmSegment&) = delete;
  // Unmaps; the creator also unlinks if that has not been done.
  ~ShmSegment();

  // The user area: size() bytes, 64-byte aligned, zero-filled at creation.
  std::byte* data() const { return base_ == nullptr ? nullptr : base_ + kHeaderBytes; }
  std::size_t size() const { return user_bytes_; }
  const std::string& name() const { return name_; }
  bool is_creator() const { return is_creator_; }
  ProcessId creator() const { return creator_; }

  // Removes the name from /dev/shm; mappings stay valid. Idempotent, and a
  // no-op when the name has meanwhile been removed or reused by another
  // segment; a failure to unlink is logged. Call once every local rank has
  // mapped the segment.
  void unlink();
  bool unlinked() const { return unlinked_; }

 private:
  ShmSegment(std::string name, std::byte* base, std::size_t user_bytes, ProcessId creator, bool is_creator,
             dev_t device, ino_t inode);
  void release() noexcept;

  std::string name_;
  std::byte* base_ = nullptr;  // the mapping, header included
  std::size_t user_bytes_ = 0;
  ProcessId creator_;
  bool is_creator_ = false;
  bool unlinked_ = false;
  dev_t device_ = 0;  // identity of the file we mapped, so unlink never
  ino_t inode_ = 0;   // removes a newer segment that reuses the name
};

}  // namespace dlop::transport
