// A large all-reduce run as a sequence of smaller ones ("chunks"), so that
// more urgent traffic can overtake it between chunks.
//
// Every rank cuts the same operation the same way (chunk_count and
// chunk_range depend only on the byte count, the element size and the chunk
// size), and chunk i runs as an operation of its own with sequence number
// seq + i: the engine reserves the op's chunk count of sequence numbers at
// submission, so each chunk has its own tag space and its messages can only
// match its own, whatever the engine progresses meanwhile.
//
// Why holding a chunked op between chunks cannot deadlock:
//  - Tasks are made in the same order on every rank: operations start in
//    submission order, and starting an operation first makes every chunk
//    not yet made of the running chunked operations of its communicator
//    (make_all). Algorithms that take shared per-host resources in creation
//    order (the shm arena's rounds) therefore agree on every rank; only the
//    order in which chunks and other ops are *progressed* differs.
//  - Messages of different operations never match each other (tag spaces),
//    so an operation's progress depends only on its own peers' progress.
//  - A chunked op is held only while a more urgent collective is in flight,
//    and for at most the engine's hold limit (kMaxHold) while that op shows
//    no progress (a chunked one shows each chunk it finishes): it may be one
//    a peer has not submitted yet because it waits for this chunked op to
//    finish first. After the limit the chunked op stops yielding to it.
//    (Holding is skipped where the urgent op may itself wait on the held
//    one on this rank: chunks on the host arena, which later arena ops
//    queue behind, and DLOP_DEBUG=detail, which makes tasks in sequence
//    order.)
//    Every running op is thus progressed again within a bounded time, and
//    each op finishes once all its members progress it.
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <vector>

#include "collectives/task.hpp"

namespace dlop::sched {

// How many chunks an operation of `bytes` bytes runs as (1: not chunked).
std::size_t chunk_count(std::size_t bytes, std::size_t chunk_bytes);
// Elements [first, first + count) of chunk `index` of `chunks` over `count` elements.
struct ChunkRange {
  std::size_t first;
  std::size_t count;
};
ChunkRange chunk_range(std::size_t count, std::size_t chunks, std::size_t index);

class ChunkedTask final : public coll::Task {
 public:
  using Clock = std::chrono::steady_clock;
  using MakeChunk = std::function<std::unique_ptr<coll::Task>(std::size_t index)>;
  // Called when a chunk finishes here (for the trace).
  using ChunkDone = std::function<void(std::size_t index, Clock::time_point start, Clock::time_point end)>;

  ChunkedTask(std::size_t chunks, MakeChunk make, ChunkDone done);

  // Whether the next chunk may begin (the engine holds a bulk op between
  // chunks while more urgent traffic is in flight).
  void allow_next(bool allow) { allow_next_ = allow; }
  // True when no chunk is running: the last one finished (or none began).
  bool between_chunks() const { return !running_ && next_ < chunks_.size(); }
  std::size_t chunks_done() const { return next_; }
  // Whether its chunks wait on shared-memory flags (the host arena), known
  // once the first chunk is made. Such chunks run in creation order behind
  // one another and every later arena op: holding one only stalls those.
  bool chunks_poll_memory() const { return chunks_poll_memory_; }
  // Makes every chunk not made yet, in order.
  void make_all();
  void make(std::size_t index);

  bool progress() override;
  std::vector<int> waiting_for() const override;
  bool polls_memory() const override;
  bool has_local_work() const override;

 private:
  std::vector<std::unique_ptr<coll::Task>> chunks_;
  MakeChunk make_;
  ChunkDone done_;
  std::size_t made_ = 0;
  std::size_t next_ = 0;  // the running chunk, or the next to begin
  bool running_ = false;
  bool allow_next_ = true;
  bool chunks_poll_memory_ = false;
  Clock::time_point chunk_start_;
};

}  // namespace dlop::sched
