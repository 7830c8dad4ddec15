#include "scheduler/data_credits.hpp"

#include <algorithm>
#include <cmath>

namespace dlop::sched {

void DataCredits::gradient_started(Clock::time_point now) {
  if (gradients_.fetch_add(1, std::memory_order_relaxed) > 0) return;
  // Credit is for while gradients move: none saved from before.
  std::lock_guard lock(mutex_);
  credit_ = 0;
  accrued_at_ = now;
}

void DataCredits::gradient_finished() {
  if (gradients_.fetch_sub(1, std::memory_order_relaxed) != 1) return;
  std::lock_guard lock(wakers_mutex_);
  for (const auto& [key, wake] : wakers_) wake();
}

void DataCredits::accrue(Clock::time_point now) {
  const double per_us = static_cast<double>(options_.bytes_per_interval) / static_cast<double>(options_.interval.count());
  const double elapsed_us = std::chrono::duration<double, std::micro>(now - accrued_at_).count();
  if (elapsed_us <= 0) return;
  credit_ = std::min(credit_ + per_us * elapsed_us, per_us * static_cast<double>(options_.burst.count()));
  accrued_at_ = now;
}

std::size_t DataCredits::acquire(std::size_t bytes, std::uint64_t deadline_step, Clock::time_point now) {
  if (!gradient_in_flight() || deadline_step <= step() + 1) return bytes;
  std::lock_guard lock(mutex_);
  accrue(now);
  const std::size_t granted = std::min(bytes, static_cast<std::size_t>(credit_));
  credit_ -= static_cast<double>(granted);
  return granted;
}

std::chrono::microseconds DataCredits::time_for(std::size_t bytes, Clock::time_point now) {
  std::lock_guard lock(mutex_);
  accrue(now);
  const double per_us = static_cast<double>(options_.bytes_per_interval) / static_cast<double>(options_.interval.count());
  const double missing = std::max(0.0, static_cast<double>(bytes) - credit_);
  return std::chrono::microseconds(static_cast<std::int64_t>(std::ceil(missing / per_us)));
}

void DataCredits::add_waker(const void* key, std::function<void()> wake) {
  std::lock_guard lock(wakers_mutex_);
  wakers_[key] = std::move(wake);
}

void DataCredits::remove_waker(const void* key) {
  std::lock_guard lock(wakers_mutex_);
  wakers_.erase(key);
}

}  // namespace dlop::sched
