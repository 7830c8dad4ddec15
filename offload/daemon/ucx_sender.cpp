#include "ucx_sender.hpp"

#include <chrono>

#include "core/error.hpp"
#include "core/log.hpp"

namespace dlop::offload::daemon {

namespace {

using Clock = std::chrono::steady_clock;

}  // namespace

UcxSender::UcxSender() : worker_(std::make_unique<transport::UcxWorker>(batch_worker_options())) {
  endpoints_ = std::make_unique<transport::Endpoints>(*worker_, transport::Endpoints::Options{});
}

UcxSender::~UcxSender() {
  for (std::size_t i = 0; i < endpoints_->size(); ++i) endpoints_->close(static_cast<int>(i), "daemon stopping");
  // Give UCX a moment to fail the pending sends; their buffers belong to the
  // executor, which outlives nothing here.
  const auto deadline = Clock::now() + std::chrono::seconds(2);
  while (!pending_.empty() && Clock::now() < deadline) progress();
  // A send UCX never finished is abandoned: close_all() then leaves the
  // worker undestroyed rather than let UCX 1.13 abort the process.
  pending_.clear();
  endpoints_->close_all();
}

UcxSender::EndpointId UcxSender::connect(const protocol::Bytes& worker_address, const std::string& peer,
                                         bool same_host) {
  // On one host, mode NONE (Endpoints picks it) keeps shared memory: with
  // the put rendezvous this daemon writes the batch into the trainer's
  // buffer by cma and the trainer's cores copy nothing. A dead client still
  // fails the send through the error handler; a dead daemon is seen by the
  // client on the control connection. The address came from an
  // authenticated client, but a garbled one must still only fail this
  // connection: Endpoints throws for it.
  const transport::Bytes address(worker_address.begin(), worker_address.end());
  const int index = endpoints_->connect(address, same_host, "client " + peer);
  // Completes the connection before the client hears CONFIGURED. UCX 1.13
  // aborts the client's process (an assertion in its request purge) when the
  // daemon dies while the client's wire-up reply to it is still queued; once
  // this flush has completed, that reply has arrived, so a daemon killed later
  // only fails the client's endpoint, as it should.
  transport::Request flush = endpoints_->flush(index);
  try {
    flush.wait(std::chrono::seconds(10));
  } catch (const Error& e) {
    endpoints_->close(index, "its connection did not come up");
    throw_error(Errc::kTransport, "UCX connection to " + peer + " did not come up: " + e.what());
  }
  return static_cast<EndpointId>(index) + 1;
}

void UcxSender::disconnect(EndpointId id) {
  if (id == 0 || id > endpoints_->size()) return;
  endpoints_->close(static_cast<int>(id - 1), "the client's connection closed");
}

void UcxSender::send(EndpointId id, const void* data, Pieces pieces, std::uint64_t lease, Done done) {
  if (id == 0 || id > endpoints_->size()) throw_error(Errc::kInvalidArgument, "send on an unknown UCX endpoint");
  if (pieces.count() > kMaxPieces || lease > kMaxLease) {
    throw_error(Errc::kInvalidArgument, "a batch of " + std::to_string(pieces.bytes) + " bytes in more than " +
                                            std::to_string(kMaxPieces) + " pieces, or lease " + std::to_string(lease));
  }
  auto batch = std::make_shared<Batch>(Batch{pieces.count(), std::nullopt, std::move(done)});
  const auto* bytes = static_cast<const std::byte*>(data);
  for (std::size_t k = 0; k < pieces.count(); ++k) {
    pending_.push_back(Pending{endpoints_->send(static_cast<int>(id - 1), bytes + pieces.offset(k), pieces.size(k),
                                                piece_tag(lease, k)),
                               batch});
  }
}

bool UcxSender::progress() {
  bool any = false;
  while (endpoints_->progress()) any = true;
  // Run the callbacks of completed batches (outside UCX's callback, so they
  // may post new sends or close endpoints).
  std::vector<std::shared_ptr<Batch>> ready;
  std::erase_if(pending_, [&](Pending& p) {
    // The buffer goes back to the executor with `done`: only once UCX let go of every piece.
    if (!p.request.done() || !p.request.released_by_ucx()) return false;
    if (!p.batch->error) p.batch->error = failure_of(p.request);
    if (--p.batch->pieces_left == 0) ready.push_back(p.batch);
    return true;
  });
  for (auto& b : ready) b->done(b->error);
  return any || !ready.empty();
}

}  // namespace dlop::offload::daemon
