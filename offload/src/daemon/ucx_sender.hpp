// The daemon's side of the data plane: one UCX worker, one endpoint per
// configured client (made from the worker address the client sent), and
// tagged sends of finished batches into the buffers the clients posted.
// Driven by the daemon's event-loop thread only.
#pragma once

#include <ucp/api/ucp.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "offload/protocol.hpp"
#include "transport/ucx_worker.hpp"

namespace dlop::offload::daemon {

class UcxSender {
 public:
  using EndpointId = std::uint64_t;
  // Runs from progress(): status UCS_OK, or why the send failed.
  using Done = std::function<void(ucs_status_t status)>;

  UcxSender();
  // Force-closes every endpoint; sends still pending fail (their callbacks run).
  ~UcxSender();
  UcxSender(const UcxSender&) = delete;
  UcxSender& operator=(const UcxSender&) = delete;

  // An endpoint to a client's worker, in peer error mode: the client may be
  // on another host, and its death must fail our sends rather than hang them.
  // Throws dlop::Error(kTransport) when UCX refuses the address.
  EndpointId connect(const protocol::Bytes& worker_address, const std::string& peer, bool same_host);
  // Force-closes the endpoint: its pending sends complete with an error.
  void disconnect(EndpointId id);

  // Sends `bytes` at `data` with `tag`; `data` must stay valid until `done`
  // runs. A send to a failed endpoint fails at once (done still runs from
  // progress(), never from inside send()).
  void send(EndpointId id, const void* data, std::size_t bytes, std::uint64_t tag, Done done);

  // Progresses UCX and runs completions; true if anything happened.
  bool progress();
  int event_fd() const { return worker_.event_fd(); }
  bool arm() { return worker_.arm(); }

 private:
  struct Endpoint {
    EndpointId id = 0;
    std::string peer;
    ucp_ep_h ep = nullptr;
    std::string failure;  // set by UCX's error callback
  };
  struct SendOp {
    Done done;
    ucs_status_t status = UCS_INPROGRESS;
  };

  static void on_send(void* request, ucs_status_t status, void* user_data);
  static void on_ep_error(void* arg, ucp_ep_h ep, ucs_status_t status);
  void wire_up(Endpoint& e);
  void close_ep(ucp_ep_h ep);

  EndpointId next_id_ = 1;
  std::map<EndpointId, std::unique_ptr<Endpoint>> endpoints_;
  Endpoint* connecting_ = nullptr;  // in wire_up, not yet in endpoints_
  std::vector<std::unique_ptr<SendOp>> finished_;  // completed, callbacks not yet run
  std::vector<void*> closing_;                     // ep close requests in flight
  // Last, so destroyed first: UCX may call on_ep_error while the worker goes,
  // and that looks at endpoints_.
  transport::UcxWorker worker_;
};

}  // namespace dlop::offload::daemon
