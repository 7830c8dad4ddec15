// The trainer's side of one dlop-offloader connection: connect and
// authenticate, configure a pipeline, ask for batches to be made into
// buffers of the caller's, and collect their completions.
//
// A batch travels by UCX straight into the caller's buffer (a tagged
// receive posted by produce(), tag = the lease id), and its BATCH_READY by
// the TCP control connection; a completion is reported once both arrived, so
// a completed buffer holds the whole batch. Leases, reissue and exactly-once
// belong to the layer above (the lease manager); this class only keeps the
// promise that a buffer is never written after its lease completed, failed,
// was canceled or was lost with the daemon.
//
// Driven by one thread at a time; with Options::progress, a background
// thread progresses the UCX receives meanwhile, so a batch lands while the
// caller computes (it still reads the answer on the socket). Errors are dlop::Error: kPeerDead when the
// daemon dies or cannot be reached, kProtocol when it answers nonsense,
// kInvalidArgument for a refused token or configuration, kTimeout for a
// blocking call that got no answer in time.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/config.hpp"
#include "core/error.hpp"
#include "offload/protocol.hpp"
#include "offload/protocol_messages.hpp"

namespace dlop::transport {
class Endpoints;
class ProgressThread;
class UcxWorker;
}

namespace dlop::offload {

struct OffloadConfig {
  std::string source;          // image folder or record file, as the daemon's host sees it
  std::string transform_json;  // a TransformSpec (media/image_spec.hpp); its "on_error" is the error policy
  std::uint64_t seed = 0;
  std::uint32_t batch_size = 0;
  // Non-empty: the generic Python path, a pickled Dataset + collate_fn
  // (dlop.data._python_job.encode_job); source and transform_json unused.
  std::vector<std::uint8_t> python;
};

// Where things lie in a batch buffer (see protocol::Configured): samples
// from offset 0, int64 labels from labels_offset, lengths (when any) from
// lengths_offset.
using BatchLayout = protocol::Configured;

struct Completion {
  enum class Status { kReady, kFailed, kCanceled };
  Status status = Status::kReady;
  std::uint64_t lease = 0;
  std::uint64_t batch = 0;
  // kReady: samples in the buffer and the bytes written; skipped samples
  // (skip policy) are listed, the others moved up in order.
  std::uint32_t count = 0;
  std::size_t bytes = 0;
  std::vector<protocol::Skipped> skipped;
  // kFailed: the daemon's code and message (kSample: a sample failed under
  // the raise policy).
  protocol::ErrorCode error_code = protocol::ErrorCode::kInternal;
  std::string error;
};

// Paces batch transfers against the trainer's gradient traffic on the same
// links. The c10d backend hands in its engine's credits (offload does not
// link the scheduler); a batch's deadline is the training step that consumes
// it, its position in the rank's epoch. Called from the progress thread and
// the consumer's, so implementations are thread-safe.
class DataPacer {
 public:
  virtual ~DataPacer() = default;
  // How many of `bytes` may move now for the batch step `deadline_step`
  // consumes (the rest: ask again later).
  virtual std::size_t acquire(std::size_t bytes, std::uint64_t deadline_step) = 0;
  // The step now running: the position of the batch the consumer took last.
  virtual void set_step(std::uint64_t step) = 0;
  // When to ask again for `bytes` refused now (sooner if woken).
  virtual std::chrono::microseconds retry_after(std::size_t /*bytes*/) { return std::chrono::milliseconds(1); }
  // `bytes` granted took `took` from their receive's posting to landing
  // (how fast the link moves data, for pacers that plan ahead).
  virtual void moved(std::size_t /*bytes*/, std::chrono::microseconds /*took*/) {}
  // `wake` runs (from any thread, quickly) when refused data may move at
  // once; one per key, removed before `wake`'s target dies. None by default.
  virtual void add_waker(const void* /*key*/, std::function<void()> /*wake*/) {}
  virtual void remove_waker(const void* /*key*/) {}
};

class OffloadClient {
 public:
  struct Options {
    std::string name = "dlop";  // shown in the daemon's logs
    // Connecting, authenticating, configure() and stats() give up after this.
    std::chrono::milliseconds timeout = config().timeout;
    // configure() of a Python job waits this long instead: the daemon's
    // worker imports torch and unpickles the dataset first (seconds on a
    // loaded host). Zero: `timeout`.
    std::chrono::milliseconds python_load_timeout{0};
    // A worker to receive batches on, shared with other clients (its thread
    // rules apply); null: the client makes its own. Lease ids must then be
    // unique across all the clients sharing it, as they are the UCX tags.
    // Make a shared one with make_worker().
    std::shared_ptr<transport::UcxWorker> worker;
    // A thread that progresses the worker in the background (then its
    // worker is used, and `worker` is ignored): batches over UCX land without
    // the caller calling in. null: UCX moves only inside this client's calls.
    // Make one over make_worker(); share it between the clients of one process.
    std::shared_ptr<transport::ProgressThread> progress;
    // A daemon on this host may write native batches straight into their
    // buffers (process_vm_writev, after this process proved its pid), with
    // one TCP answer per batch and no UCX rendezvous: the trainer wakes once
    // per batch instead of twice. false: always over UCX.
    bool direct = true;
    // With `progress`: a UCX batch travels in pieces of `piece_bytes` (or
    // whole), and each piece's receive is posted from the progress thread
    // once the daemon's piece has arrived there (its rendezvous announcement: the
    // data move only after our receive matched it) and the pacer granted
    // its bytes. The pacer is asked when the data would move, not when the
    // lease is issued (which may be steps earlier), and a gradient that
    // starts meanwhile waits behind at most `pieces_in_flight` pieces.
    // Direct writes are not paced. null, or no progress thread: receives
    // are posted at once, one per batch.
    std::shared_ptr<DataPacer> pacer;
    // Paced batches' piece size: at least protocol::kMinPieceBytes, or 0
    // for whole batches (DLOP_DATA_PIECE_BYTES, default 0: see
    // docs/architecture.md for why).
    std::size_t piece_bytes = config().data_piece_bytes;
    // Paced pieces (whole batches with piece_bytes 0) moving at once
    // (posted, not landed), over all leases.
    std::size_t pieces_in_flight = 2;
  };

  // Rendezvous by put: the daemon writes each batch into the posted buffer
  // (cma on one host, RDMA write across hosts), so the trainer's cores do not
  // copy batches; with UCX's default (get) the receiver would.
  static std::shared_ptr<transport::UcxWorker> make_worker();

  // Connects to host:port and authenticates with `token`. Throws kPeerDead
  // when nobody answers, kInvalidArgument when the daemon refuses the token,
  // kProtocol when the peer is not a dlop-offloader of this version.
  OffloadClient(const std::string& host, std::uint16_t port, std::string token, Options options);
  OffloadClient(const std::string& host, std::uint16_t port, std::string token);
  // Cancels what is pending and waits (briefly) until no buffer can be written.
  ~OffloadClient();
  OffloadClient(const OffloadClient&) = delete;
  OffloadClient& operator=(const OffloadClient&) = delete;

  // Once per connection. Throws kInvalidArgument with the daemon's reason.
  const BatchLayout& configure(const OffloadConfig& config);
  const BatchLayout& layout() const;

  // Asks for the batch of `indices` (1 .. batch_size) in `epoch`, to be
  // written into `buffer` (at least layout().batch_bytes). `lease` is
  // nonzero and not open. The buffer is the daemon's until this lease's
  // completion is returned, or a call threw kPeerDead.
  void produce(std::uint64_t lease, std::uint64_t epoch, std::uint64_t batch, std::span<const std::uint64_t> indices,
               void* buffer, std::size_t capacity);
  // The generic Python path (layout().dtype == kPythonBlob): a batch's size
  // is known once its BATCH_READY arrives; `buffer_for(bytes)` is called then
  // (from poll/wait) and gives the memory it is received into, which is the
  // daemon's until the completion, as above.
  using BufferFor = std::function<void*(std::size_t bytes)>;
  void produce(std::uint64_t lease, std::uint64_t epoch, std::uint64_t batch, std::span<const std::uint64_t> indices,
               BufferFor buffer_for);
  // Asks the daemon to drop a lease; it still completes (kCanceled, or
  // kReady/kFailed when its answer was already on the way).
  void cancel(std::uint64_t lease);

  // A completion if one is ready, without blocking.
  std::optional<Completion> poll();
  // Waits up to `timeout` for a completion.
  std::optional<Completion> wait(std::chrono::milliseconds timeout);
  // To sleep on several clients at once (one poll(2) over all their fds):
  // arms this client's worker and gives the fds that wake it, or nothing
  // when something is waiting already (call poll() then, without sleeping).
  std::vector<int> wake_fds();
  // The daemon's counters (a round trip; completions arriving meanwhile are kept).
  protocol::Stats stats();
  // A round trip to the daemon; throws kPeerDead if it is gone.
  void ping();

  std::size_t in_flight() const { return leases_.size(); }
  // Whether the lease's batch has landed in its buffer over UCX: looks only,
  // progresses nothing and reads no socket (its completion still needs the
  // daemon's answer, read by poll/wait). For tests and diagnostics.
  bool landed(std::uint64_t lease) const;
  // After kPeerDead: the leases that were open, to be reissued elsewhere.
  const std::vector<std::uint64_t>& lost_leases() const { return lost_; }
  const protocol::Welcome& daemon() const { return welcome_; }
  // The daemon's busy fraction (protocol::BatchReady::busy) as its latest
  // BATCH_READY gave it, and when that answer was read; nullopt before the
  // first.
  struct Busy {
    double fraction = 0;
    std::chrono::steady_clock::time_point when;
  };
  const std::optional<Busy>& busy() const { return busy_; }
  const std::string& address() const { return address_; }

 private:
  using Clock = std::chrono::steady_clock;
  struct Lease;
  struct Socket;

  void handshake();
  void send(protocol::MsgType type, const protocol::Bytes& payload);
  // Reads what the socket has (waiting up to `timeout` for something) and
  // handles every frame; returns the frames that are not lease answers.
  std::vector<protocol::Frame> pump(std::chrono::milliseconds timeout);
  // Waits up to `timeout` (0: options_.timeout) for a frame of `type` (or ERROR).
  protocol::Frame await(protocol::MsgType type, const char* what, std::chrono::milliseconds timeout = {});
  // Posts the lease's next piece's receive.
  void post_piece(Lease& lease);
  // Every piece now, or (paced) each once it arrived and the pacer granted it.
  void post_or_defer(Lease& lease, void* buffer, std::size_t bytes);
  // The progress thread's hook (lock held): posts the deferred pieces that
  // arrived and that the pacer grants, earliest deadline first. While an
  // arrived piece waits for credit: when to look again (the pacer's word;
  // no UCX event will come for it).
  std::optional<std::chrono::microseconds> post_granted();
  // Tells the pacer of the lease's pieces that landed since it last did.
  void report_moved(Lease& lease, Clock::time_point now);
  // Posts a deferred lease's next piece without asking (cancel, or granted).
  void post_deferred_now(Lease& lease);
  // Cancels the lease's posted receives from piece `from` on.
  void cancel_receives(Lease& lease, std::size_t from);
  bool paced() const { return options_.pacer && options_.progress; }
  void on_answer(const protocol::Frame& frame);
  void collect();
  [[noreturn]] void fail(Errc code, const std::string& why);
  void release_receives();
  // A client dropped with leases open takes in the daemon's last answers
  // until the daemon closes its side, and posts the receives of the batches
  // they announce: closing over unread answers would reset the connection
  // (the daemon logs "Connection reset by peer"), and a batch sent over UCX
  // with no receive would stay unmatched in the worker ("unexpected
  // tag-receive descriptor" when it is destroyed). At most 5 s.
  void close_quietly();
  // Waits until a direct daemon can no longer write into this process's
  // buffers (it closed the connection or died); then closes the socket.
  void close_direct();
  bool progress_worker();
  // Held around every UCX call when a progress thread shares the worker.
  std::unique_lock<std::recursive_mutex> lock_worker() const;
  // Configured for direct writes: no lease of this client uses UCX.
  bool direct() const { return layout_ && layout_->direct; }
  // The daemon ran on this host and its process no longer exists.
  bool daemon_gone() const;

  std::string address_;  // "host:port", for messages
  std::string token_;
  Options options_;
  std::unique_ptr<Socket> socket_;
  protocol::FrameWriter writer_;
  protocol::FrameDecoder decoder_;
  protocol::Welcome welcome_;
  std::optional<BatchLayout> layout_;
  std::unique_ptr<transport::Endpoints> endpoints_;  // before leases_, whose receives it holds
  protocol::Nonce direct_proof_{};  // WELCOME's nonce, where a same-host daemon reads it (CONFIGURE)
  std::map<std::uint64_t, std::unique_ptr<Lease>> leases_;
  std::size_t piece_bytes_ = 0;  // CONFIGURE's: 0 unless paced
  // Leases of leases_ with pieces not posted or not landed yet (paced); under lock_worker().
  std::vector<Lease*> deferred_;
  std::optional<std::string> deferred_failure_;  // a deferred post that failed on the progress thread
  std::deque<Completion> ready_;
  std::vector<protocol::Frame> unsolicited_;  // replies read while waiting for something else
  std::vector<std::uint64_t> lost_;
  std::optional<Error> failure_;  // once the connection is gone, every call throws this
  std::optional<Busy> busy_;
  std::uint64_t next_ping_ = 1;
  bool authenticating_ = false;  // HELLO sent, WELCOME not yet in
};

}  // namespace dlop::offload
