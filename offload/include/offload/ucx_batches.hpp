// What the daemon's sends and the client's receives of batches over UCX must
// agree on, defined once for both sides.
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>

#include "core/error.hpp"
#include "transport/request.hpp"
#include "transport/ucx_worker.hpp"

namespace dlop::offload {

// The put rendezvous, asked for on both sides: UCX 1.13 chooses the scheme
// where the send starts, so the daemon needs it too for a batch to be written
// straight into the trainer's buffer.
inline transport::UcxWorker::Options batch_worker_options() {
  transport::UcxWorker::Options o;
  o.ucx_config = {{"RNDV_SCHEME", "put_zcopy"}};
  return o;
}

// A batch of `bytes` goes as pieces of CONFIGURE's piece_bytes (0: one piece),
// piece k holding bytes [k * piece_bytes, min((k + 1) * piece_bytes, bytes)),
// each a tagged message of its own: tag = k << kPieceShift | lease. Lease ids
// stay below 1 << kPieceShift, pieces per batch below kMaxPieces.
inline constexpr int kPieceShift = 48;
inline constexpr std::uint64_t kMaxLease = (std::uint64_t{1} << kPieceShift) - 1;
inline constexpr std::size_t kMaxPieces = std::size_t{1} << (64 - kPieceShift);

struct Pieces {
  std::size_t bytes = 0;        // the batch's
  std::size_t piece_bytes = 0;  // 0: the batch is one piece

  std::size_t count() const {
    if (piece_bytes == 0 || bytes == 0) return 1;
    return (bytes + piece_bytes - 1) / piece_bytes;
  }
  std::size_t offset(std::size_t k) const { return k * piece_bytes; }
  std::size_t size(std::size_t k) const {
    return piece_bytes == 0 ? bytes : std::min(piece_bytes, bytes - offset(k));
  }
};

inline std::uint64_t piece_tag(std::uint64_t lease, std::size_t piece) {
  return static_cast<std::uint64_t>(piece) << kPieceShift | lease;
}

// nullopt if the finished request succeeded, else why not.
inline std::optional<std::string> failure_of(transport::Request& request) {
  try {
    request.test();
    return std::nullopt;
  } catch (const Error& e) {
    return std::string(e.what());
  }
}

}  // namespace dlop::offload
