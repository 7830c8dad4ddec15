// The daemon's compute side: one thread that takes batch jobs in arrival
// order and runs each on a WorkerPool of --threads threads (that thread
// included), into a staging buffer laid out as the client's buffer is.
// Finished batches wait in a done list until the event loop sends them.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "media/image_pipeline.hpp"
#include "media/source.hpp"
#include "offload/protocol_messages.hpp"
#include "stats.hpp"

namespace dlop::offload::daemon {

// What one CONFIGURE set up; shared by the connection and its jobs.
struct Dataset {
  std::shared_ptr<const media::Source> source;  // native only
  std::shared_ptr<const media::BatchMaker> maker;  // native only
  bool python = false;                   // the generic Python path: batches are blobs of varying size
  std::uint64_t seed = 0;
  std::uint32_t batch_size = 0;
  protocol::Configured layout;
};

struct SpareBuffers;

// Memory a batch is made in and sent from.
struct Staging {
  std::unique_ptr<std::byte[]> data;
  std::size_t capacity = 0;
  bool pooled = true;  // one of the Executor's (the Python path's are its own)
  std::weak_ptr<SpareBuffers> home;  // where release() puts it back, when not pooled
};

// Buffers given back once their batch was sent, for the next batch of the
// same maker (a fresh buffer of tens of MiB costs a page fault per page).
struct SpareBuffers {
  static constexpr std::size_t kMax = 4;
  std::mutex mutex;
  std::vector<Staging> free;
  // One of at least `bytes`, else a new one.
  Staging take(std::size_t bytes, const std::shared_ptr<SpareBuffers>& self);
  void give(Staging s);
};

struct Job {
  std::uint64_t conn = 0;
  std::uint64_t lease = 0;
  std::uint64_t epoch = 0;
  std::uint64_t batch = 0;
  std::vector<std::uint64_t> indices;
  std::shared_ptr<const Dataset> dataset;
};

struct JobResult {
  Job job;
  Staging staging;           // empty when the job failed
  std::size_t bytes = 0;     // to send: layout.bytes_for(count)
  protocol::BatchReady ready;
  std::optional<protocol::ErrorMsg> error;
};

class Executor {
 public:
  // `wake` is called (from the compute thread) whenever a result is ready.
  Executor(std::size_t threads, DaemonStats& stats, std::function<void()> wake);
  ~Executor();  // stops after the running job; queued ones are dropped
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;

  void submit(Job job);
  // Removes a queued job; false if it is already running or done.
  bool cancel_queued(std::uint64_t conn, std::uint64_t lease);
  // Removes every queued job of a closed connection.
  void drop_connection(std::uint64_t conn);
  std::vector<JobResult> take_results();
  // Adds a result made elsewhere (the Python path) and wakes the event loop.
  void post(JobResult result);
  // Wakes the event loop for news from elsewhere (a Python worker loaded).
  void wake() { wake_(); }
  // Gives back a result's staging buffer once its send is over.
  void release(Staging staging);

 private:
  void run();
  // Never throws: failures become the result's error.
  JobResult execute(Job job, Staging& staging);
  Staging acquire(std::size_t bytes, std::unique_lock<std::mutex>& lock);

  // At most this many batches exist at once (made, being sent or waiting),
  // which bounds the daemon's memory to a few batches per its pace.
  static constexpr std::size_t kMaxStaged = 4;

  DaemonStats& stats_;
  std::function<void()> wake_;
  media::WorkerPool pool_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<Job> queue_;
  std::vector<JobResult> results_;
  std::vector<Staging> free_;
  std::size_t staged_ = 0;  // buffers handed out and not yet released
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace dlop::offload::daemon
