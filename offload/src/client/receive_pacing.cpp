// The client's receive half: posting a batch's pieces at once, or (paced)
// each once it arrived and the pacer granted it, and telling the pacer how
// fast the landed ones moved.
#include <algorithm>

#include "core/error.hpp"
#include "core/trace.hpp"
#include "lease.hpp"
#include "transport/endpoints.hpp"
#include "offload/ucx_batches.hpp"

namespace dlop::offload {

using Clock = std::chrono::steady_clock;

void OffloadClient::post_piece(Lease& lease) {
  auto lock = lock_worker();
  const std::size_t k = lease.recvs.size();
  // All bits of the tag: each piece of each lease finds its own place.
  lease.recvs.push_back(endpoints_->recv(-1, static_cast<std::byte*>(lease.buffer) + lease.pieces.offset(k),
                                         lease.pieces.size(k), piece_tag(lease.id, k), ~std::uint64_t{0}));
  lease.posted_at.push_back(Clock::now());
  lease.granted = 0;
  lease.arrived_at.reset();
  if (lease.recvs.back().done()) {
    if (const auto why = failure_of(lease.recvs.back())) throw_error(Errc::kTransport, "posting a UCX receive: " + *why);
  }
}

void OffloadClient::post_or_defer(Lease& lease, void* buffer, std::size_t bytes) {
  auto lock = lock_worker();
  lease.buffer = buffer;
  lease.pieces = Pieces{bytes, piece_bytes_};
  lease.expected = lease.pieces.count();
  if (!paced()) {
    while (lease.deferred()) post_piece(lease);
    return;
  }
  deferred_.push_back(&lease);
}

void OffloadClient::report_moved(Lease& lease, Clock::time_point now) {
  // Pieces land in order: each landed one tells the pacer how fast data move.
  for (auto& k = lease.reported; k < lease.recvs.size() && lease.recvs[k].done(); ++k) {
    if (failure_of(lease.recvs[k])) continue;
    const auto size = lease.pieces.size(k);
    options_.pacer->moved(size, std::chrono::duration_cast<std::chrono::microseconds>(now - lease.posted_at[k]));
    if (trace::enabled()) {
      trace::span("moved " + std::to_string(lease.batch), "data", lease.posted_at[k], now,
                  {{"batch", static_cast<std::int64_t>(lease.batch)},
                   {"piece", static_cast<std::int64_t>(k)},
                   {"bytes", static_cast<std::int64_t>(size)}});
    }
  }
}

std::optional<std::chrono::microseconds> OffloadClient::post_granted() {
  if (deferred_.empty() || deferred_failure_) return std::nullopt;
  std::sort(deferred_.begin(), deferred_.end(), [](const Lease* a, const Lease* b) { return a->batch < b->batch; });
  // Pieces posted and still moving: at most pieces_in_flight at a time, so
  // that a gradient starting now queues behind that many, not behind every
  // batch granted while the link was free.
  std::size_t moving = 0;
  const auto now = Clock::now();
  for (Lease* lease : deferred_) {
    moving += static_cast<std::size_t>(std::count_if(lease->recvs.begin(), lease->recvs.end(),
                                                     [](const transport::Request& r) { return !r.done(); }));
    report_moved(*lease, now);
  }
  std::optional<std::chrono::microseconds> holding;
  for (Lease* lease : deferred_) {
    // Pieces arrive in order (one endpoint, sent in order): the next one's
    // announcement means the ones before it were announced too.
    while (!holding && lease->deferred() && moving < options_.pieces_in_flight) {
      const std::size_t k = lease->recvs.size();
      if (!lease->arrived_at) {
        if (!endpoints_->arrived(piece_tag(lease->id, k), ~std::uint64_t{0})) break;  // its arrival wakes this thread
        lease->arrived_at = Clock::now();
      }
      lease->granted += options_.pacer->acquire(lease->pieces.size(k) - lease->granted, lease->batch);
      if (lease->granted < lease->pieces.size(k)) {
        // An earlier deadline waits for credit: later ones wait too.
        holding = options_.pacer->retry_after(lease->pieces.size(k) - lease->granted);
        break;
      }
      try {
        post_deferred_now(*lease);
      } catch (const Error& e) {
        deferred_failure_ = e.what();  // the consumer's next call fails the connection with it
        return std::nullopt;
      }
      ++moving;
    }
  }
  // A lease leaves once every piece is posted and has landed (its last
  // pieces still count against the window until then).
  std::erase_if(deferred_, [](const Lease* l) { return !l->deferred() && !l->receiving(); });
  return holding;
}

void OffloadClient::post_deferred_now(Lease& lease) {
  const auto now = Clock::now();
  const std::size_t k = lease.recvs.size();
  // A span only for a piece that waited for credit (not one granted on arrival).
  if (trace::enabled() && lease.arrived_at && now - *lease.arrived_at > std::chrono::microseconds(100)) {
    trace::span("paced " + std::to_string(lease.batch), "data", *lease.arrived_at, now,
                {{"batch", static_cast<std::int64_t>(lease.batch)},
                 {"piece", static_cast<std::int64_t>(k)},
                 {"bytes", static_cast<std::int64_t>(lease.pieces.size(k))}});
  }
  post_piece(lease);
}

void OffloadClient::cancel_receives(Lease& lease, std::size_t from) {
  for (std::size_t k = from; k < lease.recvs.size(); ++k) {
    if (!lease.recvs[k].done()) lease.recvs[k].cancel();
  }
}

}  // namespace dlop::offload
