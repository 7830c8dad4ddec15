// The client's record of one open lease, shared by its connection half
// (offload_client.cpp) and its receive and pacing half (receive_pacing.cpp).
#pragma once

#include <algorithm>
#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "offload/offload_client.hpp"
#include "transport/request.hpp"
#include "offload/ucx_batches.hpp"

namespace dlop::offload {

// One open lease: the posted receives and whatever the daemon answered.
struct OffloadClient::Lease {
  std::uint64_t id = 0;
  std::uint64_t batch = 0;
  bool settled = false;     // no data will come (a direct lease's answer, a Python lease's failure)
  std::uint32_t asked = 0;  // indices in the PRODUCE
  bool direct = false;      // the daemon writes into the buffer itself; its answer says it is done
  std::optional<protocol::Frame> answer;  // BATCH_READY, ERROR or CANCELED
  BufferFor buffer_for;  // the Python path: the receive is posted on BATCH_READY
  // The batch's receive: `pieces` of `buffer`, recvs[k] the posted UCX
  // receive of piece k. Pieces past recvs.size() and below `expected` are
  // deferred (paced; the lease is in deferred_): `granted` bytes of the next
  // one are the pacer's so far, and it arrived at `arrived_at` (unset: not yet).
  void* buffer = nullptr;
  Pieces pieces;
  std::size_t expected = 0;  // pieces that will be posted (fewer once the daemon said fewer come)
  std::vector<transport::Request> recvs;
  std::vector<std::chrono::steady_clock::time_point> posted_at;  // per piece posted
  std::size_t reported = 0;                  // pieces before it: landing told to the pacer
  std::size_t granted = 0;
  std::optional<std::chrono::steady_clock::time_point> arrived_at;

  bool deferred() const { return recvs.size() < expected; }
  // UCX still holds some of the buffer.
  bool receiving() const {
    return std::any_of(recvs.begin(), recvs.end(), [](const transport::Request& r) { return !r.done(); });
  }
  // The data are in, or none will come (every receive finished either way).
  bool received() const { return settled || (!deferred() && !receiving()); }
  // Why the batch of `bytes` did not land whole in pieces 0.., or nullopt.
  std::optional<std::string> short_of(std::size_t bytes) {
    const Pieces landed{bytes, pieces.piece_bytes};
    if (landed.count() > recvs.size()) return "only " + std::to_string(recvs.size()) + " pieces were received";
    for (std::size_t k = 0; k < landed.count(); ++k) {
      if (auto why = failure_of(recvs[k])) return "piece " + std::to_string(k) + ": " + *why;
      if (recvs[k].received_bytes() != landed.size(k)) {
        return "piece " + std::to_string(k) + " holds " + std::to_string(recvs[k].received_bytes()) + " bytes";
      }
    }
    return std::nullopt;
  }
};

}  // namespace dlop::offload
