#include "chunked_task.hpp"

#include <algorithm>

namespace dlop::sched {

std::size_t chunk_count(std::size_t bytes, std::size_t chunk_bytes) {
  if (chunk_bytes == 0 || bytes <= chunk_bytes) return 1;
  return (bytes + chunk_bytes - 1) / chunk_bytes;
}

ChunkRange chunk_range(std::size_t count, std::size_t chunks, std::size_t index) {
  // Even split: sizes differ by at most one element, so no chunk is a tiny
  // remainder that would pick another algorithm.
  const std::size_t base = count / chunks, extra = count % chunks;
  const std::size_t first = index * base + std::min(index, extra);
  return {first, base + (index < extra ? 1 : 0)};
}

ChunkedTask::ChunkedTask(std::size_t chunks, MakeChunk make, ChunkDone done)
    : chunks_(chunks), make_(std::move(make)), done_(std::move(done)) {}

void ChunkedTask::make(std::size_t index) {
  chunks_[index] = make_(index);
  if (index == 0) chunks_poll_memory_ = chunks_[0]->polls_memory();
  made_ = index + 1;
}

void ChunkedTask::make_all() {
  while (made_ < chunks_.size()) make(made_);
}

bool ChunkedTask::progress() {
  while (next_ < chunks_.size()) {
    if (!running_) {
      if (!allow_next_) return false;
      if (made_ == next_) make(next_);
      running_ = true;
      if (done_) chunk_start_ = Clock::now();
    }
    if (!chunks_[next_]->progress()) return false;
    chunks_[next_].reset();  // its scratch goes now, not with the whole op
    if (done_) done_(next_, chunk_start_, Clock::now());
    running_ = false;
    ++next_;
  }
  return true;
}

std::vector<int> ChunkedTask::waiting_for() const {
  return running_ ? chunks_[next_]->waiting_for() : std::vector<int>{};
}

bool ChunkedTask::polls_memory() const { return running_ && chunks_[next_]->polls_memory(); }

bool ChunkedTask::has_local_work() const { return running_ && chunks_[next_]->has_local_work(); }

}  // namespace dlop::sched
