#include "scheduler/data_credits.hpp"

#include <algorithm>

namespace dlop::sched {

std::size_t DataCredits::acquire(std::size_t bytes, std::uint64_t deadline_step, Clock::time_point now) {
  if (!gradient_in_flight() || deadline_step <= step() + 1) return bytes;
  std::lock_guard lock(mutex_);
  if (now - interval_start_ >= options_.interval) {
    interval_start_ = now;
    granted_in_interval_ = 0;
  }
  const std::size_t granted = std::min(bytes, options_.bytes_per_interval - granted_in_interval_);
  granted_in_interval_ += granted;
  return granted;
}

}  // namespace dlop::sched
