#include "scheduler/data_credits.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

namespace dlop::sched {

namespace {

using std::chrono::microseconds;

template <class T>
void remember(std::deque<T>& recent, T value, std::size_t keep) {
  recent.push_back(value);
  if (recent.size() > keep) recent.pop_front();
}

}  // namespace

void DataCredits::gradient_started(Clock::time_point now) {
  if (gradients_.fetch_add(1, std::memory_order_relaxed) > 0) return;
  std::lock_guard lock(mutex_);
  // Credit is for while gradients move: none saved from before.
  credit_ = 0;
  accrued_at_ = now;
  if (quiet_spell_) {
    remember(spells_[*quiet_spell_], std::chrono::duration_cast<microseconds>(now - quiet_since_), kStepsRemembered);
    quiet_spell_.reset();
  }
}

void DataCredits::gradient_finished(Clock::time_point now) {
  if (gradients_.fetch_sub(1, std::memory_order_relaxed) != 1) return;
  {
    std::lock_guard lock(mutex_);
    quiet_since_ = busy_until_ = now;
    quiet_spell_ = spells_this_step_ < kSpellsPerStep ? std::optional(spells_this_step_) : std::nullopt;
    ++spells_this_step_;
  }
  std::lock_guard lock(wakers_mutex_);
  for (const auto& [key, wake] : wakers_) wake();
}

void DataCredits::gradient_until(std::function<bool()> ended, Clock::time_point now) {
  gradient_started(now);
  std::lock_guard lock(outside_mutex_);
  outside_.push_back(std::move(ended));
  has_outside_.store(true, std::memory_order_relaxed);
}

void DataCredits::check_outside(Clock::time_point now) {
  if (!has_outside_.load(std::memory_order_relaxed)) return;
  std::size_t ended = 0;
  {
    // try_lock: a check already running answers for this caller too.
    std::unique_lock lock(outside_mutex_, std::try_to_lock);
    if (!lock.owns_lock()) return;
    while (!outside_.empty() && outside_.front()()) {
      outside_.pop_front();
      ++ended;
    }
    has_outside_.store(!outside_.empty(), std::memory_order_relaxed);
  }
  // Outside the lock: the last one's wakers may start a mover that acquires.
  while (ended-- > 0) gradient_finished(now);
}

void DataCredits::set_step(std::uint64_t step) {
  if (step_.exchange(step, std::memory_order_relaxed) == step) return;
  std::lock_guard lock(mutex_);
  spells_this_step_ = 0;
}

std::optional<DataCredits::Spell> DataCredits::spell() const {
  if (!quiet_spell_ || rates_.empty()) return std::nullopt;
  const auto& recent = spells_[*quiet_spell_];
  if (recent.empty()) return std::nullopt;
  const auto [shortest, longest] = std::minmax_element(recent.begin(), recent.end());
  microseconds roomiest{0};
  for (const auto& other : spells_) {
    if (!other.empty()) roomiest = std::max(roomiest, *std::min_element(other.begin(), other.end()));
  }
  return Spell{quiet_since_ + *shortest, quiet_since_ + 2 * *longest + options_.quiet_margin, roomiest};
}

microseconds DataCredits::moving_time(std::size_t bytes) const {
  // The median: data share their links with other traffic as they did.
  std::vector<double> rates(rates_.begin(), rates_.end());
  std::nth_element(rates.begin(), rates.begin() + static_cast<std::ptrdiff_t>(rates.size() / 2), rates.end());
  return microseconds(static_cast<std::int64_t>(std::ceil(static_cast<double>(bytes) / rates[rates.size() / 2])));
}

void DataCredits::accrue(Clock::time_point now) {
  const double per_us = static_cast<double>(options_.bytes_per_interval) / static_cast<double>(options_.interval.count());
  const double elapsed_us = std::chrono::duration<double, std::micro>(now - accrued_at_).count();
  if (elapsed_us <= 0) return;
  credit_ = std::min(credit_ + per_us * elapsed_us, per_us * static_cast<double>(options_.burst.count()));
  accrued_at_ = now;
}

std::size_t DataCredits::acquire(std::size_t bytes, std::uint64_t deadline_step, Clock::time_point now) {
  if (deadline_step <= step() + 1) return bytes;
  check_outside(now);
  std::lock_guard lock(mutex_);
  if (!gradient_in_flight()) {
    const auto quiet = spell();
    if (!quiet || now >= quiet->broken) return bytes;
    const auto took = moving_time(bytes);
    const auto moved = std::max(now, busy_until_) + took;
    // In time for the next gradient, or too big for any spell: it goes.
    if (moved + options_.quiet_margin > quiet->due && took + options_.quiet_margin <= quiet->roomiest) return 0;
    busy_until_ = moved;
    return bytes;
  }
  accrue(now);
  const std::size_t granted = std::min(bytes, static_cast<std::size_t>(credit_));
  credit_ -= static_cast<double>(granted);
  return granted;
}

microseconds DataCredits::time_for(std::size_t bytes, Clock::time_point now) {
  check_outside(now);
  std::lock_guard lock(mutex_);
  if (!gradient_in_flight()) {
    const auto quiet = spell();
    // Held in a quiet spell: the next gradient will wake the mover (and pace
    // it), or the spell outlasts its pattern.
    return quiet ? std::max(microseconds(1), std::chrono::duration_cast<microseconds>(quiet->broken - now))
                 : microseconds(0);
  }
  accrue(now);
  const double per_us = static_cast<double>(options_.bytes_per_interval) / static_cast<double>(options_.interval.count());
  const double missing = std::max(0.0, static_cast<double>(bytes) - credit_);
  return microseconds(static_cast<std::int64_t>(std::ceil(missing / per_us)));
}

void DataCredits::data_moved(std::size_t bytes, microseconds took) {
  if (bytes == 0 || took.count() <= 0) return;
  std::lock_guard lock(mutex_);
  remember(rates_, static_cast<double>(bytes) / static_cast<double>(took.count()), kRatesRemembered);
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
