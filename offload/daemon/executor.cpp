#include "executor.hpp"

#include <pthread.h>

#include <chrono>
#include <cstring>

#include "core/error.hpp"
#include "core/log.hpp"
#include "media/image.hpp"

namespace dlop::offload::daemon {

namespace {

using Clock = std::chrono::steady_clock;

}  // namespace

Executor::Executor(std::size_t threads, DaemonStats& stats, std::function<void()> wake)
    : stats_(stats), wake_(std::move(wake)), pool_(threads), thread_([this] { run(); }) {
  stats_.busy.set_capacity(threads);
}

Executor::~Executor() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void Executor::submit(Job job) {
  {
    std::lock_guard lock(mutex_);
    queue_.push_back(std::move(job));
  }
  cv_.notify_all();
}

bool Executor::cancel_queued(std::uint64_t conn, std::uint64_t lease) {
  std::lock_guard lock(mutex_);
  return std::erase_if(queue_, [&](const Job& j) { return j.conn == conn && j.lease == lease; }) > 0;
}

void Executor::drop_connection(std::uint64_t conn) {
  std::lock_guard lock(mutex_);
  std::erase_if(queue_, [&](const Job& j) { return j.conn == conn; });
}

std::vector<JobResult> Executor::take_results() {
  std::lock_guard lock(mutex_);
  return std::exchange(results_, {});
}

void Executor::post(JobResult result) {
  {
    std::lock_guard lock(mutex_);
    results_.push_back(std::move(result));
  }
  wake_();
}

Staging SpareBuffers::take(std::size_t bytes, const std::shared_ptr<SpareBuffers>& self) {
  {
    std::lock_guard lock(mutex);
    for (auto it = free.begin(); it != free.end(); ++it) {
      if (it->capacity < bytes) continue;
      Staging s = std::move(*it);
      free.erase(it);
      return s;
    }
  }
  return Staging{std::make_unique_for_overwrite<std::byte[]>(bytes), bytes, /*pooled=*/false, self};
}

void SpareBuffers::give(Staging s) {
  std::lock_guard lock(mutex);
  if (free.size() < kMax) free.push_back(std::move(s));
}

void Executor::release(Staging staging) {
  if (!staging.pooled) {
    if (auto home = staging.home.lock(); home && staging.data) home->give(std::move(staging));
    return;
  }
  {
    std::lock_guard lock(mutex_);
    if (staging.data) free_.push_back(std::move(staging));
    --staged_;
  }
  cv_.notify_all();
}

Staging Executor::acquire(std::size_t bytes, std::unique_lock<std::mutex>& lock) {
  cv_.wait(lock, [&] { return stop_ || staged_ < kMaxStaged; });
  ++staged_;
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (it->capacity >= bytes) {
      Staging s = std::move(*it);
      free_.erase(it);
      return s;
    }
  }
  // None large enough: drop the smallest spare rather than keep growing.
  if (free_.size() + staged_ > kMaxStaged && !free_.empty()) free_.erase(free_.begin());
  lock.unlock();
  Staging s{std::make_unique_for_overwrite<std::byte[]>(bytes), bytes};
  lock.lock();
  return s;
}

void Executor::run() {
  pthread_setname_np(pthread_self(), "dlop-compute");
  std::unique_lock lock(mutex_);
  while (true) {
    cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
    if (stop_) return;
    const std::size_t need = queue_.front().dataset->layout.batch_bytes;
    Staging staging = acquire(need, lock);
    if (stop_) return;
    if (queue_.empty()) {  // canceled while we waited for a buffer
      free_.push_back(std::move(staging));
      --staged_;
      continue;
    }
    Job job = std::move(queue_.front());
    queue_.pop_front();
    lock.unlock();
    JobResult result = execute(std::move(job), staging);
    lock.lock();
    if (!result.staging.data) {  // failed: the buffer goes back at once
      if (staging.data) free_.push_back(std::move(staging));
      --staged_;
    }
    results_.push_back(std::move(result));
    lock.unlock();
    wake_();
    lock.lock();
  }
}

JobResult Executor::execute(Job job, Staging& staging) {
  JobResult r;
  r.job = std::move(job);
  const Dataset& d = *r.job.dataset;
  r.ready.lease = r.job.lease;
  r.ready.batch = r.job.batch;
  const auto fail = [&](protocol::ErrorCode code, const std::string& message) {
    r.error = protocol::ErrorMsg{r.job.lease, code, message.substr(0, protocol::kMaxText)};
    stats_.batches_failed.fetch_add(1, std::memory_order_relaxed);
  };
  try {
    const std::size_t n = r.job.indices.size();
    // A buffer kept from another dataset may be too small for this one.
    if (staging.capacity < d.layout.batch_bytes) {
      staging = Staging{std::make_unique_for_overwrite<std::byte[]>(d.layout.batch_bytes), d.layout.batch_bytes};
    }
    std::byte* base = staging.data.get();
    const media::BatchOut out{{base, n * d.layout.sample_bytes},
                       {reinterpret_cast<std::int64_t*>(base + d.layout.labels_offset), n * d.layout.label_width},
                       d.layout.lengths_offset != 0
                           ? std::span<std::int64_t>(reinterpret_cast<std::int64_t*>(base + d.layout.lengths_offset), n)
                           : std::span<std::int64_t>()};
    const auto start = Clock::now();
    media::BatchResult b = [&] {
      const BusyMeter::Scope busy(stats_.busy, stats_.busy.capacity());  // a native batch holds the whole pool
      return d.maker->run_batch(*d.source, r.job.indices, d.seed, r.job.epoch, out, &pool_);
    }();
    stats_.batch.add(1, Clock::now() - start, b.count * d.layout.sample_bytes);
    stats_.samples_made.fetch_add(b.count, std::memory_order_relaxed);
    const std::uint64_t tried = r.job.indices.size();
    stats_.read.add(tried, b.seconds.read, b.seconds.read_bytes);
    stats_.decode.add(tried, b.seconds.decode, b.seconds.decoded_bytes);
    stats_.augment.add(b.count, b.seconds.augment, 0);
    stats_.collate.add(b.count, b.seconds.collate, b.count * d.layout.sample_bytes);
    stats_.samples_skipped.fetch_add(b.skipped.size(), std::memory_order_relaxed);
    r.ready.count = static_cast<std::uint32_t>(b.count);
    for (auto& s : b.skipped) r.ready.skipped.push_back({s.index, s.reason.substr(0, protocol::kMaxText)});
    r.bytes = d.layout.bytes_for(b.count);
    r.ready.bytes = r.bytes;
    r.staging = std::move(staging);
  } catch (const media::SampleError& e) {
    fail(protocol::ErrorCode::kSample, e.what());
  } catch (const Error& e) {
    fail(e.code() == Errc::kInvalidArgument ? protocol::ErrorCode::kInvalidArgument : protocol::ErrorCode::kInternal,
         e.what());
  } catch (const std::exception& e) {  // out of memory, among others: this batch fails, the daemon stays
    fail(protocol::ErrorCode::kInternal, e.what());
  }
  return r;
}

}  // namespace dlop::offload::daemon
