#include "offload/offload_client.hpp"

#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "core/log.hpp"
#include "core/trace.hpp"
#include "core/wait_policy.hpp"
#include "core/process.hpp"
#include "offload/protocol_auth.hpp"
#include "lease.hpp"
#include "offload/ucx_batches.hpp"
#include "transport/endpoints.hpp"
#include "transport/progress_thread.hpp"
#include "transport/socket.hpp"

namespace dlop::offload {

using Clock = std::chrono::steady_clock;
using protocol::MsgType;

struct OffloadClient::Socket {
  transport::net::UniqueFd fd;
};

std::shared_ptr<transport::UcxWorker> OffloadClient::make_worker() {
  return std::make_shared<transport::UcxWorker>(batch_worker_options());
}

OffloadClient::OffloadClient(const std::string& host, std::uint16_t port, std::string token)
    : OffloadClient(host, port, std::move(token), Options{}) {}

OffloadClient::OffloadClient(const std::string& host, std::uint16_t port, std::string token, Options options)
    : address_(host + ":" + std::to_string(port)),
      token_(std::move(token)),
      options_(std::move(options)),
      socket_(std::make_unique<Socket>()) {
  if (options_.progress) options_.worker = options_.progress->worker_ptr();
  if (!options_.worker) options_.worker = make_worker();
  // No endpoints: the client only posts receives; the daemon connects to it.
  endpoints_ = std::make_unique<transport::Endpoints>(*options_.worker, transport::Endpoints::Options{});
  endpoints_->set_any_name("dlop-offloader at " + address_);
  std::string why;
  socket_->fd = transport::net::try_connect(host, port, Clock::now() + options_.timeout, why);
  if (!socket_->fd) throw_error(Errc::kPeerDead, "cannot connect to dlop-offloader at " + address_ + ": " + why);
  transport::net::tune_socket(socket_->fd.get());
  handshake();
  if (paced()) {
    options_.progress->set_hook(this, [this] { return post_granted(); });
    options_.pacer->add_waker(this, [progress = options_.progress.get()] { progress->wake(); });
  }
}

OffloadClient::~OffloadClient() {
  if (paced()) {
    options_.pacer->remove_waker(this);
    options_.progress->remove_hook(this);
    // Unpaced from here on: what still arrives is taken in at once.
    auto lock = lock_worker();
    for (Lease* l : std::exchange(deferred_, {})) {
      while (l->deferred()) post_deferred_now(*l);
    }
    options_.pacer.reset();
  }
  close_quietly();
  close_direct();
  auto lock = lock_worker();
  try {
    release_receives();
  } catch (const std::exception& e) {
    log().warn("offload client {}: {}", address_, e.what());
  }
  leases_.clear();
  endpoints_.reset();
}

std::unique_lock<std::recursive_mutex> OffloadClient::lock_worker() const {
  return options_.progress ? options_.progress->lock() : std::unique_lock<std::recursive_mutex>();
}

void OffloadClient::fail(Errc code, const std::string& why) {
  if (!failure_) {
    close_direct();
    for (const auto& [id, lease] : leases_) lost_.push_back(id);
    auto lock = lock_worker();
    release_receives();
    leases_.clear();
    try {
      throw_error(code, "dlop-offloader at " + address_ + ": " + why +
                            (lost_.empty() ? "" : " (" + std::to_string(lost_.size()) + " leases lost)"));
    } catch (const Error& e) {
      failure_ = e;
    }
  }
  throw *failure_;
}

bool OffloadClient::daemon_gone() const {
  return welcome_.pid != 0 && welcome_.host == host_identity() && ::kill(static_cast<pid_t>(welcome_.pid), 0) != 0 &&
         errno == ESRCH;
}

void OffloadClient::close_quietly() {
  if (failure_ || direct() || socket_->fd.get() < 0 || leases_.empty()) return;
  // Our end of stream makes the daemon close its side once it has answered.
  ::shutdown(socket_->fd.get(), SHUT_WR);
  const auto deadline = Clock::now() + std::chrono::seconds(5);
  try {
    while (!failure_ && !daemon_gone() && Clock::now() < deadline) pump(std::chrono::milliseconds(100));
  } catch (const Error&) {
    // The daemon closed its side (the end waited for) or the connection broke: nothing more comes.
  }
}

void OffloadClient::close_direct() {
  const int fd = socket_->fd.get();
  const bool open_direct = std::any_of(leases_.begin(), leases_.end(), [](const auto& kv) {
    return kv.second->direct && !kv.second->answer;
  });
  if (fd >= 0 && open_direct) {
    // The daemon writes on its event loop, which also closes its side when it
    // reads our end of stream: its end of stream means no write is running.
    ::shutdown(fd, SHUT_WR);
    const auto deadline = Clock::now() + std::chrono::seconds(5);
    std::uint8_t buf[4096];
    while (!daemon_gone()) {
      pollfd p{fd, POLLIN, 0};
      if (Clock::now() > deadline) {
        log().error("offload client {}: the daemon did not close within 5 s; it may still write into {}", address_,
                    "the buffers of its open leases");
        break;
      }
      if (::poll(&p, 1, 100) < 0 && errno != EINTR) break;
      const ssize_t got = ::recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
      if (got == 0 || (got < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) break;
    }
  }
  socket_->fd.reset();
}

bool OffloadClient::progress_worker() {
  auto lock = lock_worker();
  bool any = false;
  while (endpoints_->progress()) any = true;
  return any;
}

// Cancels every posted receive and progresses until UCX let go of the
// buffers, so that none is written once the caller gets it back.
void OffloadClient::release_receives() {
  auto lock = lock_worker();
  deferred_.clear();  // nothing was posted for them: no buffer of theirs is UCX's
  for (const auto& [id, lease] : leases_) {
    lease->expected = lease->recvs.size();
    cancel_receives(*lease, 0);
  }
  const auto deadline = Clock::now() + std::chrono::seconds(5);
  // A receive UCX holds (a Python lease before its BATCH_READY has none).
  const auto pending = [this] {
    for (const auto& [id, lease] : leases_) {
      if (lease->receiving()) return true;
    }
    return false;
  };
  Waiter waiter;
  while (pending()) {
    // A matched rendezvous cannot be canceled, and on one host (shared
    // memory, error mode NONE) nothing fails it when the daemon died: but a
    // dead daemon writes nothing more, so its buffers are free at once.
    const bool gone = daemon_gone();
    if (gone || Clock::now() > deadline) {
      // UCX may still hold these requests: leak their state rather than free it.
      if (!gone) log().error("offload client {}: UCX did not release a canceled receive within 5 s", address_);
      for (auto& [id, lease] : leases_) {
        if (lease->receiving()) (void)lease.release();
      }
      std::erase_if(leases_, [](const auto& kv) { return kv.second == nullptr; });
      break;
    }
    if (!progress_worker() && !waiter.pause()) waiter.sleep_a_little();
  }
}

void OffloadClient::send(MsgType type, const protocol::Bytes& payload) {
  if (failure_) throw *failure_;
  const protocol::Bytes frame = writer_.encode(type, payload);
  std::size_t sent = 0;
  const auto deadline = Clock::now() + options_.timeout;
  while (sent < frame.size()) {
    const ssize_t n = ::send(socket_->fd.get(), frame.data() + sent, frame.size() - sent, MSG_NOSIGNAL);
    if (n > 0) {
      sent += static_cast<std::size_t>(n);
    } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      // The daemon is not reading: keep our side moving while we wait.
      progress_worker();
      pollfd p{socket_->fd.get(), POLLOUT, 0};
      if (::poll(&p, 1, transport::net::poll_ms(std::min(deadline, Clock::now() + std::chrono::milliseconds(10)))) == 0 &&
          Clock::now() > deadline) {
        fail(Errc::kTimeout, "sending " + std::string(protocol::type_name(type)) + " timed out");
      }
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else {
      fail(Errc::kPeerDead, std::string("connection lost: ") + std::strerror(errno));
    }
  }
}

std::vector<protocol::Frame> OffloadClient::pump(std::chrono::milliseconds timeout) {
  if (failure_) throw *failure_;
  std::vector<protocol::Frame> frames;
  pollfd fds[2] = {{socket_->fd.get(), POLLIN, 0}, {options_.worker->event_fd(), POLLIN, 0}};
  int n = 0;
  if (direct()) {
    // Nothing of this client's goes through UCX: the socket says it all.
    n = ::poll(fds, 1, static_cast<int>(std::max<std::int64_t>(timeout.count(), 0)));
  } else if (options_.progress) {
    // The progress thread owns the worker's event fd and says when it did something.
    fds[1].fd = options_.progress->activity_fd();
    n = ::poll(fds, 2, static_cast<int>(std::max<std::int64_t>(timeout.count(), 0)));
  } else {
    const bool armed = timeout.count() > 0 && !progress_worker() && options_.worker->arm();
    n = ::poll(fds, armed ? 2 : 1, armed ? static_cast<int>(timeout.count()) : 0);
  }
  if (n < 0 && errno != EINTR) fail(Errc::kSystem, std::string("poll: ") + std::strerror(errno));
  // With a progress thread too: the answer the caller waits for (CONFIGURED
  // after the daemon flushed its endpoint to us) may need this worker's
  // progress, and progressing here costs nothing when there is none to do.
  if (!direct()) progress_worker();
  if (n <= 0 || fds[0].revents == 0) return frames;
  std::uint8_t buf[64 * 1024];
  // How the connection ended, if it did: the frames that came before the end
  // still count (a draining daemon closes right after its last answers).
  std::optional<std::pair<Errc, std::string>> ended;
  while (true) {
    const ssize_t got = ::recv(socket_->fd.get(), buf, sizeof(buf), 0);
    if (got == 0) {
      ended = authenticating_
                  ? std::pair(Errc::kInvalidArgument, "the daemon closed the connection after HELLO: it refused the token")
                  : std::pair(Errc::kPeerDead, "the daemon closed the connection (it died or stopped)");
      break;
    }
    if (got < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) break;
      ended = std::pair(Errc::kPeerDead, std::string("connection lost: ") + std::strerror(errno));
      break;
    }
    decoder_.feed(std::span(buf, static_cast<std::size_t>(got)));
  }
  try {
    while (auto frame = decoder_.next()) {
      const MsgType t = frame->type;
      if (t == MsgType::kBatchReady || t == MsgType::kCanceled || (t == MsgType::kError && layout_)) {
        on_answer(*frame);
      } else {
        frames.push_back(std::move(*frame));
      }
    }
  } catch (const Error& e) {
    if (failure_) throw;
    fail(Errc::kProtocol, e.what());
  }
  if (ended) {
    // Leases answered before the end complete; the others are lost. The
    // failure is thrown once the completions were taken (wait()).
    collect();
    try {
      fail(ended->first, ended->second);
    } catch (const Error&) {
      if (ready_.empty()) throw;
    }
  }
  return frames;
}

protocol::Frame OffloadClient::await(MsgType type, const char* what, std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + (timeout.count() > 0 ? timeout : options_.timeout);
  while (true) {
    for (auto it = unsolicited_.begin(); it != unsolicited_.end(); ++it) {
      if (it->type == type || it->type == MsgType::kError) {
        protocol::Frame f = std::move(*it);
        unsolicited_.erase(it);
        return f;
      }
      fail(Errc::kProtocol, std::string("unexpected ") + std::string(protocol::type_name(it->type)) + " while waiting for " + what);
    }
    if (Clock::now() > deadline) fail(Errc::kTimeout, std::string("no answer to ") + what + " in time");
    auto frames = pump(std::chrono::milliseconds(transport::net::poll_ms(deadline)));
    unsolicited_.insert(unsolicited_.end(), std::make_move_iterator(frames.begin()), std::make_move_iterator(frames.end()));
  }
}

void OffloadClient::handshake() {
  const protocol::Frame first = await(MsgType::kChallenge, "the connection (CHALLENGE)");
  if (first.type != MsgType::kChallenge) fail(Errc::kProtocol, "the daemon did not open with CHALLENGE");
  const auto challenge = protocol::decode<protocol::Challenge>(first.payload);
  protocol::Hello hello;
  hello.client_nonce = protocol::random_nonce();
  hello.proof = protocol::hello_proof(token_, challenge.server_nonce, hello.client_nonce);
  hello.client_name = options_.name.substr(0, protocol::kMaxName);
  send(MsgType::kHello, protocol::encode(hello));
  // Everything after HELLO is keyed both ways. A daemon that refuses the
  // proof closes without a word (it has no key to seal an answer with).
  const auto keys = protocol::session_keys(token_, challenge.server_nonce, hello.client_nonce);
  writer_.set_key(keys.client_to_server);
  decoder_.set_key(keys.server_to_client);
  authenticating_ = true;
  const protocol::Frame welcome = await(MsgType::kWelcome, "HELLO (WELCOME)");
  authenticating_ = false;
  if (welcome.type != MsgType::kWelcome) fail(Errc::kProtocol, "the daemon answered HELLO with ERROR");
  welcome_ = protocol::decode<protocol::Welcome>(welcome.payload);
  log().info("offload client: connected to {} ({}, pid {}, {} threads)", address_, welcome_.daemon_name, welcome_.pid,
             welcome_.threads);
}

const BatchLayout& OffloadClient::layout() const {
  if (!layout_) throw_error(Errc::kInvalidArgument, "offload client " + address_ + ": not configured");
  return *layout_;
}

const BatchLayout& OffloadClient::configure(const OffloadConfig& config) {
  if (layout_) throw_error(Errc::kInvalidArgument, "offload client " + address_ + ": already configured");
  protocol::Configure m;
  const transport::Bytes address = [this] {
    auto lock = lock_worker();
    return options_.worker->address();
  }();
  m.worker_address.assign(address.begin(), address.end());
  m.host = host_identity();
  m.source = config.source;
  m.transform = config.transform_json;
  m.python = config.python;
  m.seed = config.seed;
  m.batch_size = config.batch_size;
  m.piece_bytes = paced() ? options_.piece_bytes : 0;
  if (m.piece_bytes != 0 && m.piece_bytes < protocol::kMinPieceBytes) {
    throw_error(Errc::kInvalidArgument, "offload client " + address_ + ": pieces of " + std::to_string(m.piece_bytes) +
                                            " bytes (DLOP_DATA_PIECE_BYTES): at least " +
                                            std::to_string(protocol::kMinPieceBytes) + ", or 0 for whole batches");
  }
  if (options_.direct && config.python.empty() && welcome_.host == host_identity()) {
    direct_proof_ = welcome_.direct_nonce;
    m.pid = static_cast<std::uint32_t>(::getpid());
    m.proof_address = reinterpret_cast<std::uintptr_t>(direct_proof_.data());
  }
  send(MsgType::kConfigure, protocol::encode(m));
  const protocol::Frame answer = await(MsgType::kConfigured, "CONFIGURE",
                                       config.python.empty() ? options_.timeout : options_.python_load_timeout);
  if (answer.type == MsgType::kError) {
    const auto e = protocol::decode<protocol::ErrorMsg>(answer.payload);
    // kInternal: the daemon could not connect back to this worker (kTransport, worth another try).
    throw_error(e.code == protocol::ErrorCode::kInternal ? Errc::kTransport : Errc::kInvalidArgument,
                "dlop-offloader at " + address_ + " refused the configuration: " + e.message);
  }
  const auto configured = protocol::decode<protocol::Configured>(answer.payload);
  if (configured.direct && m.pid == 0) fail(Errc::kProtocol, "CONFIGURED direct writes that were not offered");
  if ((configured.dtype == protocol::Dtype::kPythonBlob) != !config.python.empty()) {
    fail(Errc::kProtocol, "CONFIGURED for the other path (native or Python) than asked");
  }
  if (configured.dtype != protocol::Dtype::kPythonBlob &&
      (configured.labels_offset < configured.sample_bytes * config.batch_size ||
       configured.batch_bytes < configured.bytes_for(config.batch_size) ||
       (configured.lengths_offset != 0 &&
        configured.lengths_offset < configured.labels_offset + std::uint64_t{config.batch_size} * configured.label_width * 8))) {
    fail(Errc::kProtocol, "CONFIGURED layout too small for the batch size");
  }
  layout_ = configured;
  piece_bytes_ = m.piece_bytes;
  return *layout_;
}

void OffloadClient::produce(std::uint64_t lease, std::uint64_t epoch, std::uint64_t batch,
                            std::span<const std::uint64_t> indices, void* buffer, std::size_t capacity) {
  if (failure_) throw *failure_;
  const BatchLayout& l = layout();
  if (lease == 0 || leases_.contains(lease)) {
    throw_error(Errc::kInvalidArgument, "lease " + std::to_string(lease) + " is zero or already open");
  }
  if (capacity < l.batch_bytes) {
    throw_error(Errc::kInvalidArgument, "buffer of " + std::to_string(capacity) + " bytes for batches of " +
                                            std::to_string(l.batch_bytes));
  }
  if (l.dtype == protocol::Dtype::kPythonBlob) {
    throw_error(Errc::kInvalidArgument, "the Python path's batches vary in size: produce with a BufferFor");
  }
  auto state = std::make_unique<Lease>();
  state->id = lease;
  state->batch = batch;
  state->asked = static_cast<std::uint32_t>(indices.size());
  protocol::Produce m{lease, epoch, batch, std::vector<std::uint64_t>(indices.begin(), indices.end()), 0};
  if (l.direct) {
    state->direct = true;
    m.address = reinterpret_cast<std::uintptr_t>(buffer);
  } else {
    // Unpaced: post before asking, so the batch finds its buffer (no
    // unexpected-message copy). Paced: piece by piece, once each arrived
    // and is granted.
    if (lease > kMaxLease) throw_error(Errc::kInvalidArgument, "lease " + std::to_string(lease) + " above 2^48 - 1");
    post_or_defer(*state, buffer, l.batch_bytes);
  }
  leases_.emplace(lease, std::move(state));
  send(MsgType::kProduce, protocol::encode(m));
}

void OffloadClient::produce(std::uint64_t lease, std::uint64_t epoch, std::uint64_t batch,
                            std::span<const std::uint64_t> indices, BufferFor buffer_for) {
  if (failure_) throw *failure_;
  if (layout().dtype != protocol::Dtype::kPythonBlob) {
    throw_error(Errc::kInvalidArgument, "native batches have a fixed size: produce into a buffer");
  }
  if (lease == 0 || leases_.contains(lease)) {
    throw_error(Errc::kInvalidArgument, "lease " + std::to_string(lease) + " is zero or already open");
  }
  if (lease > kMaxLease) throw_error(Errc::kInvalidArgument, "lease " + std::to_string(lease) + " above 2^48 - 1");
  auto state = std::make_unique<Lease>();
  state->id = lease;
  state->batch = batch;
  state->asked = static_cast<std::uint32_t>(indices.size());
  state->buffer_for = std::move(buffer_for);
  leases_.emplace(lease, std::move(state));
  protocol::Produce m{lease, epoch, batch, std::vector<std::uint64_t>(indices.begin(), indices.end()), 0};
  send(MsgType::kProduce, protocol::encode(m));
}

void OffloadClient::cancel(std::uint64_t lease) {
  const auto it = leases_.find(lease);
  if (it == leases_.end()) return;
  {
    // A daemon that sent already waits for our receives to match: post
    // them, so its sends end and our receives can be canceled like any other.
    auto lock = lock_worker();
    Lease& l = *it->second;
    if (std::erase(deferred_, &l) > 0) {
      while (l.deferred()) post_deferred_now(l);
    }
  }
  send(MsgType::kCancel, protocol::encode(protocol::Cancel{lease}));
}

void OffloadClient::on_answer(const protocol::Frame& frame) {
  std::uint64_t id = 0;
  std::optional<protocol::BatchReady> ready;
  if (frame.type == MsgType::kBatchReady) {
    ready = protocol::decode<protocol::BatchReady>(frame.payload);
    id = ready->lease;
  }
  if (frame.type == MsgType::kCanceled) id = protocol::decode<protocol::Canceled>(frame.payload).lease;
  if (frame.type == MsgType::kError) id = protocol::decode<protocol::ErrorMsg>(frame.payload).lease;
  const auto it = leases_.find(id);
  // The Python path's BATCH_READY comes before the data, so a send that fails
  // after it is an ERROR for a lease that has its answer already.
  const bool late_error = it != leases_.end() && it->second->buffer_for && it->second->answer &&
                          it->second->answer->type == MsgType::kBatchReady && frame.type == MsgType::kError;
  if (it == leases_.end() || (it->second->answer && !late_error)) {
    fail(Errc::kProtocol, std::string(protocol::type_name(frame.type)) + " for lease " + std::to_string(id) +
                              ", which is not open");
  }
  Lease& lease = *it->second;
  lease.answer = frame;
  if (ready) busy_ = Busy{ready->busy, Clock::now()};
  if (lease.direct) {
    // Written (BATCH_READY) or never to be (CANCELED, ERROR): the buffer is ours.
    lease.settled = true;
    return;
  }
  if (lease.buffer_for && !late_error) {
    if (!ready) {
      lease.settled = true;  // nothing was posted, nothing will come
      return;
    }
    if (ready->bytes == 0 || ready->count > lease.asked) {
      fail(Errc::kProtocol, "BATCH_READY for lease " + std::to_string(id) + " with " + std::to_string(ready->bytes) +
                                " bytes and " + std::to_string(ready->count) + " samples");
    }
    post_or_defer(lease, lease.buffer_for(ready->bytes), ready->bytes);
    return;
  }
  auto lock = lock_worker();
  if (!ready) {
    // No data will come for a failed or canceled lease: post no more pieces
    // and take the buffer back.
    std::erase(deferred_, &lease);
    lease.expected = lease.recvs.size();
    cancel_receives(lease, 0);
    return;
  }
  // A batch shorter than the buffer (samples skipped) comes in fewer pieces.
  const std::size_t coming = Pieces{ready->bytes, piece_bytes_}.count();
  if (coming < lease.expected) {
    lease.expected = std::max(coming, lease.recvs.size());
    cancel_receives(lease, coming);  // posted by cancel(): nothing will fill them
    if (!lease.deferred()) std::erase(deferred_, &lease);
  }
}

// Moves leases whose answer and receive are both in to the ready list.
void OffloadClient::collect() {
  auto lock = lock_worker();
  if (deferred_failure_) fail(Errc::kTransport, "posting a paced UCX receive: " + *deferred_failure_);
  for (auto it = leases_.begin(); it != leases_.end();) {
    Lease& lease = *it->second;
    if (!lease.answer || !lease.received()) {
      ++it;
      continue;
    }
    Completion c;
    c.lease = lease.id;
    c.batch = lease.batch;
    if (lease.answer->type == MsgType::kBatchReady) {
      auto ready = protocol::decode<protocol::BatchReady>(lease.answer->payload);
      const bool python = layout_->dtype == protocol::Dtype::kPythonBlob;
      const std::optional<std::string> failed = lease.direct ? std::nullopt : lease.short_of(ready.bytes);
      if (failed || ready.count > lease.asked ||
          (!python && ready.bytes != layout_->bytes_for(ready.count))) {
        fail(Errc::kProtocol, "batch for lease " + std::to_string(lease.id) + " of " + std::to_string(ready.bytes) +
                                  " bytes (BATCH_READY) did not arrive whole: " + failed.value_or("complete"));
      }
      c.batch = ready.batch;
      c.count = ready.count;
      c.bytes = ready.bytes;
      c.skipped = std::move(ready.skipped);
    } else if (lease.answer->type == MsgType::kCanceled) {
      c.status = Completion::Status::kCanceled;
    } else {
      auto e = protocol::decode<protocol::ErrorMsg>(lease.answer->payload);
      c.status = Completion::Status::kFailed;
      c.error_code = e.code;
      c.error = std::move(e.message);
    }
    ready_.push_back(std::move(c));
    // A paced lease can complete before a progress pass reported its last
    // pieces: report them now, or the pacer would never learn of them.
    if (std::erase(deferred_, &lease) > 0) report_moved(lease, Clock::now());
    it = leases_.erase(it);
  }
}

std::vector<int> OffloadClient::wake_fds() {
  if (failure_ || !ready_.empty()) return {};
  if (direct()) return {socket_->fd.get()};
  if (options_.progress) return {socket_->fd.get(), options_.progress->activity_fd()};
  if (progress_worker() || !options_.worker->arm()) return {};
  return {socket_->fd.get(), options_.worker->event_fd()};
}

bool OffloadClient::landed(std::uint64_t lease) const {
  auto lock = lock_worker();
  const auto it = leases_.find(lease);
  return it != leases_.end() && !it->second->recvs.empty() && it->second->received();
}

std::optional<Completion> OffloadClient::poll() { return wait(std::chrono::milliseconds(0)); }

std::optional<Completion> OffloadClient::wait(std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  while (true) {
    // Before looking, so that what lands after the look wakes the poll in
    // pump(). Not in poll(): a caller polling several clients that share the
    // thread drains once itself (LeaseManager), or one client's drain would
    // swallow another's wake-up.
    if (options_.progress && timeout.count() > 0) options_.progress->drain_activity();
    collect();
    if (!ready_.empty()) {
      Completion c = std::move(ready_.front());
      ready_.pop_front();
      return c;
    }
    if (failure_) throw *failure_;
    auto frames = pump(std::chrono::milliseconds(transport::net::poll_ms(deadline)));
    unsolicited_.insert(unsolicited_.end(), std::make_move_iterator(frames.begin()), std::make_move_iterator(frames.end()));
    collect();
    if (ready_.empty() && Clock::now() >= deadline) return std::nullopt;
  }
}

protocol::Stats OffloadClient::stats() {
  send(MsgType::kStatsRequest, {});
  const protocol::Frame f = await(MsgType::kStats, "STATS_REQUEST");
  if (f.type != MsgType::kStats) fail(Errc::kProtocol, "ERROR in answer to STATS_REQUEST");
  return protocol::decode<protocol::Stats>(f.payload);
}

void OffloadClient::ping() {
  const std::uint64_t token = next_ping_++;
  send(MsgType::kPing, protocol::encode(protocol::Ping{token}));
  const protocol::Frame f = await(MsgType::kPong, "PING");
  if (f.type != MsgType::kPong || protocol::decode<protocol::Pong>(f.payload).token != token) {
    fail(Errc::kProtocol, "wrong answer to PING");
  }
}

}  // namespace dlop::offload
