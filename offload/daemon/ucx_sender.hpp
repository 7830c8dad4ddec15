// The daemon's side of the data plane: one UCX worker, one endpoint per
// configured client (made from the worker address the client sent), and
// tagged sends of finished batches into the buffers the clients posted.
// A thin layer over transport::Endpoints, which settles error modes, error
// callbacks and bounded closing; this adds the wire-up check and runs a
// callback per finished send. Driven by the daemon's event-loop thread only.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "offload/protocol.hpp"
#include "offload/ucx_batches.hpp"
#include "transport/endpoints.hpp"

namespace dlop::offload::daemon {

class UcxSender {
 public:
  using EndpointId = std::uint64_t;  // 0 is none
  // Runs from progress(): nullopt when the send completed, else why it failed.
  using Done = std::function<void(const std::optional<std::string>& error)>;

  UcxSender();
  // Force-closes every endpoint; sends still pending fail (their callbacks run).
  ~UcxSender();
  UcxSender(const UcxSender&) = delete;
  UcxSender& operator=(const UcxSender&) = delete;

  // An endpoint to a client's worker; returns once the connection is up (see
  // ucx_sender.cpp). Throws dlop::Error(kTransport) when UCX refuses the
  // address or the client does not answer.
  EndpointId connect(const protocol::Bytes& worker_address, const std::string& peer, bool same_host);
  // Force-closes the endpoint: its pending sends complete with an error.
  void disconnect(EndpointId id);

  // Sends the batch at `data` for `lease`, piece by piece (offload/ucx_batches.hpp);
  // `data` must stay valid until `done` runs, once, after every piece
  // finished (with the first piece's error, if any). A send to a failed
  // endpoint fails at once (done still runs from progress(), never from
  // inside send()).
  void send(EndpointId id, const void* data, Pieces pieces, std::uint64_t lease, Done done);

  // Progresses UCX and runs completions; true if anything happened.
  bool progress();
  int event_fd() const { return worker_->event_fd(); }
  bool arm() { return worker_->arm(); }

 private:
  struct Batch {
    std::size_t pieces_left = 0;
    std::optional<std::string> error;
    Done done;
  };
  struct Pending {
    transport::Request request;
    std::shared_ptr<Batch> batch;
  };

  std::vector<Pending> pending_;
  std::unique_ptr<transport::Endpoints> endpoints_;
  // Last, so destroyed first (after endpoints_->close_all()): UCX may call an
  // endpoint's error callback while the worker goes, and that looks at endpoints_.
  std::unique_ptr<transport::UcxWorker> worker_;
};

}  // namespace dlop::offload::daemon
