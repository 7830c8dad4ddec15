#include "delegation.hpp"

#include <c10/core/impl/VirtualGuardImpl.h>

#include <atomic>

namespace dlop::backend {
namespace {

// Delegated calls seen under graph capture so far. A count taken before one
// of them is over: the capture began after the device had synchronized.
std::atomic<std::uint64_t> captures{0};

// Whether `stream` is being captured into a graph. torch's device-generic
// API says so since it has isStreamCapturing; before, dlop cannot tell, and
// counts (and later asks) as outside a capture.
template <class Guard>
bool capturing(const Guard& guard, const c10::Stream& stream) {
  if constexpr (requires { guard.isStreamCapturing(stream); }) {
    return guard.isStreamCapturing(stream);
  } else {
    return false;
  }
}

}  // namespace

void count_until_done(const c10::intrusive_ptr<c10d::Work>& work, c10::Device device,
                      const std::shared_ptr<sched::DataCredits>& credits) {
  if (device.is_cpu()) {
    c10::intrusive_ptr<c10::ivalue::Future> future;
    try {
      future = work->getFuture();
    } catch (const c10::Error&) {
      // A Work of the older kind has none (Gloo's allreduce_coalesced): its
      // isCompleted() is a flag, asked as a device work's is.
      credits->gradient_until([work] { return work->isCompleted(); });
      return;
    }
    credits->gradient_started();
    // The callback holds the work: a future drops its callbacks once it has run them.
    future->addCallback([work, credits](c10::ivalue::Future&) { credits->gradient_finished(); });
    return;
  }
  const c10::impl::VirtualGuardImpl guard(device.type());
  if (capturing(guard, guard.getStream(device))) {
    captures.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  credits->check_outside();  // the earlier calls' ends, asked now rather than by a polling thread
  credits->gradient_until([work, epoch = captures.load(std::memory_order_relaxed)] {
    return captures.load(std::memory_order_relaxed) != epoch || work->isCompleted();
  });
}

}  // namespace dlop::backend
