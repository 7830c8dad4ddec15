// Server: what each frame of an authenticated (or authenticating) connection
// means, and the replies it makes (the event loop is server.cpp).
#include <sys/uio.h>

#include <cerrno>
#include <chrono>
#include <cstring>

#include <fmt/ranges.h>

#include "core/error.hpp"
#include "core/log.hpp"
#include "core/process.hpp"
#include "media/batch_maker.hpp"
#include "offload/protocol_auth.hpp"
#include "server.hpp"

namespace dlop::offload::daemon {

using Clock = std::chrono::steady_clock;
using protocol::ErrorCode;
using protocol::MsgType;

namespace {

// The largest batch buffer a client may ask for: a bound on the daemon's
// staging memory (a few of these at once), far above any sensible batch.
constexpr std::uint64_t kMaxBatchBytes = 2ull << 30;
// So that every batch (and every Python blob, of at most as many bytes) fits its tags.
static_assert(kMaxBatchBytes / protocol::kMinPieceBytes <= kMaxPieces);

// Whether process `pid` holds `nonce` at `address`: the client that asked for
// direct writes proves so that it is that process (only it, or whoever may
// already write its memory, can have put there the random bytes this
// connection's WELCOME carried).
bool holds_nonce(std::uint32_t pid, std::uint64_t address, const protocol::Nonce& nonce) {
  protocol::Nonce seen{};
  iovec local{seen.data(), seen.size()};
  iovec remote{reinterpret_cast<void*>(address), seen.size()};
  return ::process_vm_readv(static_cast<pid_t>(pid), &local, 1, &remote, 1, 0) == static_cast<ssize_t>(seen.size()) &&
         seen == nonce;
}

// A refused CONFIGURE: the daemon failing to connect back over UCX is its own
// failure (kInternal, which a client may try again), anything else the client's.
ErrorCode refusal_code(const std::exception& e) {
  const auto* error = dynamic_cast<const Error*>(&e);
  return error != nullptr && error->code() == Errc::kTransport ? ErrorCode::kInternal : ErrorCode::kInvalidArgument;
}

}  // namespace

void Server::on_frame(Conn& c, protocol::Frame frame) {
  if (!c.authenticated) {
    if (frame.type != MsgType::kHello) {
      throw_error(Errc::kProtocol, std::string(protocol::type_name(frame.type)) + " before authentication");
    }
    return on_hello(c, frame);
  }
  switch (frame.type) {
    case MsgType::kConfigure: return on_configure(c, protocol::decode<protocol::Configure>(frame.payload));
    case MsgType::kProduce: return on_produce(c, protocol::decode<protocol::Produce>(frame.payload));
    case MsgType::kCancel: return on_cancel(c, protocol::decode<protocol::Cancel>(frame.payload).lease);
    case MsgType::kStatsRequest:
      protocol::decode<protocol::StatsRequest>(frame.payload);
      return reply(c, stats_.snapshot(conns_.size(), open_leases()));
    case MsgType::kPing:
      return reply(c, protocol::Pong{protocol::decode<protocol::Ping>(frame.payload).token});
    default:
      throw_error(Errc::kProtocol, std::string(protocol::type_name(frame.type)) + " is not a client's message");
  }
}

void Server::on_hello(Conn& c, const protocol::Frame& frame) {
  const auto hello = protocol::decode<protocol::Hello>(frame.payload);
  const auto expected = protocol::hello_proof(options_.token, c.server_nonce, hello.client_nonce);
  if (!protocol::proof_matches(expected, hello.proof)) {
    stats_.auth_failures.fetch_add(1, std::memory_order_relaxed);
    // No answer: there is no key both sides share to seal one with.
    return close_conn(c, "authentication failed (wrong token) from client '" + hello.client_name + "'", true);
  }
  const auto keys = protocol::session_keys(options_.token, c.server_nonce, hello.client_nonce);
  c.decoder.set_key(keys.client_to_server);
  c.writer.set_key(keys.server_to_client);
  c.authenticated = true;
  c.peer += " (" + hello.client_name + ")";
  log().info("offloader: connection {} authenticated: {}", c.id, c.peer);
  c.direct_nonce = protocol::random_nonce();
  reply(c, protocol::Welcome{static_cast<std::uint32_t>(options_.threads), static_cast<std::uint32_t>(::getpid()),
                             options_.name, host_identity(), c.direct_nonce});
}

std::shared_ptr<const media::Source> Server::open_source_cached(const std::string& path, std::string_view kind) {
  const std::string key = std::string(kind) + ":" + path;
  if (auto s = sources_[key].lock()) return s;
  using media::MediaKind;
  const MediaKind media_kind = kind == "video"   ? MediaKind::kVideo
                               : kind == "audio" ? MediaKind::kAudio
                                                 : MediaKind::kImage;
  std::shared_ptr<const media::Source> s = media::open_source(path, media_kind);
  sources_[key] = s;
  std::erase_if(sources_, [](const auto& kv) { return kv.second.expired(); });
  return s;
}

void Server::on_configure(Conn& c, const protocol::Configure& m) {
  if (draining_) return reply(c, protocol::ErrorMsg{0, ErrorCode::kBusy, kDrainingRefusal});
  if (c.dataset || c.loading) {
    return reply(c, protocol::ErrorMsg{0, ErrorCode::kBadRequest, "already configured: open a new connection"});
  }
  if (!m.python.empty()) return configure_python(c, m);
  try {
    std::shared_ptr<const media::BatchMaker> maker = media::make_batch_maker(m.transform);
    std::shared_ptr<const media::Source> source = open_source_cached(m.source, maker->kind());
    const media::SampleLayout sample = maker->layout(*source);
    protocol::Configured layout;
    layout.shape = sample.shape;
    layout.dtype = sample.dtype == media::OutputType::kUint8 ? protocol::Dtype::kUint8 : protocol::Dtype::kFloat32;
    layout.sample_bytes = sample.sample_bytes();
    layout.label_width = sample.label_width;
    // Labels and lengths start on 64-byte boundaries, so every part is an
    // aligned view of one buffer for any batch size.
    const auto aligned = [](std::uint64_t n) { return (n + 63) / 64 * 64; };
    layout.labels_offset = aligned(m.batch_size * layout.sample_bytes);
    const std::uint64_t labels_end = layout.labels_offset + std::uint64_t{m.batch_size} * sample.label_width * 8;
    layout.lengths_offset = sample.lengths ? aligned(labels_end) : 0;
    layout.batch_bytes = sample.lengths ? layout.lengths_offset + std::uint64_t{m.batch_size} * 8 : labels_end;
    if (layout.batch_bytes > kMaxBatchBytes) {
      throw_error(Errc::kInvalidArgument, "a batch of " + std::to_string(m.batch_size) + " samples needs " +
                                              std::to_string(layout.batch_bytes) + " bytes, over the daemon's limit");
    }
    layout.dataset_size = source->size();
    layout.classes = static_cast<std::uint32_t>(source->classes().size());
    const std::uint64_t endpoint = sender_->connect(m.worker_address, c.peer, m.host == host_identity());
    c.endpoint = endpoint;
    c.piece_bytes = m.piece_bytes;
    if (m.pid != 0 && m.host == host_identity() && holds_nonce(m.pid, m.proof_address, c.direct_nonce)) {
      c.direct_pid = m.pid;
      layout.direct = true;
    }
    c.dataset =
        std::make_shared<const Dataset>(Dataset{std::move(source), std::move(maker), false, m.seed, m.batch_size, layout});
    log().info("offloader: connection {} configured: {} ({} samples of {}), batch {} of {}, {}", c.id, m.source,
               layout.dataset_size, c.dataset->maker->kind(), m.batch_size, fmt::join(layout.shape, "x"),
               layout.direct ? "direct writes into pid " + std::to_string(c.direct_pid) : std::string("over UCX"));
    reply(c, layout);
  } catch (const std::exception& e) {
    // A bad spec, a missing source or an unusable worker address: the client
    // may try again on this connection.
    log().info("offloader: connection {}: CONFIGURE refused: {}", c.id, e.what());
    reply(c, protocol::ErrorMsg{0, refusal_code(e), std::string(e.what()).substr(0, protocol::kMaxText)});
  }
}

void Server::configure_python(Conn& c, protocol::Configure m) {
  try {
    if (options_.python.empty()) {
      throw_error(Errc::kInvalidArgument, "this dlop-offloader runs no Python (started with --no-python)");
    }
    c.python = std::make_unique<PythonWorkers>(
        options_.python, options_.threads, m.python, stats_, [this](JobResult r) { executor_->post(std::move(r)); },
        [this] { executor_->wake(); });
    m.python.clear();  // the workers have it
    c.loading = std::move(m);
  } catch (const std::exception& e) {
    log().info("offloader: connection {}: CONFIGURE (Python) refused: {}", c.id, e.what());
    reply(c, protocol::ErrorMsg{0, ErrorCode::kInvalidArgument, std::string(e.what()).substr(0, protocol::kMaxText)});
  }
}

void Server::on_python_loads() {
  for (auto& [id, conn] : conns_) {
    Conn& c = *conn;
    if (c.closed || !c.loading || c.python->load_state() == PythonWorkers::LoadState::kLoading) continue;
    const protocol::Configure m = std::move(*c.loading);
    c.loading.reset();
    try {
      if (c.python->load_state() == PythonWorkers::LoadState::kFailed) {
        throw_error(Errc::kInvalidArgument, c.python->load_error());
      }
      protocol::Configured layout;
      layout.dataset_size = c.python->dataset_size();
      layout.dtype = protocol::Dtype::kPythonBlob;
      c.endpoint = sender_->connect(m.worker_address, c.peer, m.host == host_identity());
      c.piece_bytes = m.piece_bytes;
      c.dataset = std::make_shared<const Dataset>(Dataset{nullptr, nullptr, true, m.seed, m.batch_size, layout});
      log().info("offloader: connection {} configured: generic Python path, {} samples, batch {}, {} workers", c.id,
                 layout.dataset_size, m.batch_size, options_.threads);
      reply(c, layout);
    } catch (const std::exception& e) {
      c.python.reset();  // no worker outlives a refused CONFIGURE
      log().info("offloader: connection {}: CONFIGURE (Python) refused: {}", c.id, e.what());
      reply(c, protocol::ErrorMsg{0, refusal_code(e), std::string(e.what()).substr(0, protocol::kMaxText)});
    }
  }
}

void Server::on_produce(Conn& c, protocol::Produce m) {
  if (c.leases.contains(m.lease)) {
    // Two answers for one lease id would be ambiguous: a client bug.
    throw_error(Errc::kProtocol, "PRODUCE for lease " + std::to_string(m.lease) + ", which is still open");
  }
  if (draining_) {
    stats_.batches_refused.fetch_add(1, std::memory_order_relaxed);
    return reply(c, protocol::ErrorMsg{m.lease, ErrorCode::kBusy, kDrainingRefusal});
  }
  const auto refuse = [&](ErrorCode code, const std::string& why) {
    stats_.batches_failed.fetch_add(1, std::memory_order_relaxed);
    reply(c, protocol::ErrorMsg{m.lease, code, why});
  };
  if (!c.dataset) return refuse(ErrorCode::kBadRequest, "PRODUCE before CONFIGURE");
  if (m.address == 0 && m.lease > kMaxLease) {
    return refuse(ErrorCode::kBadRequest,
                  "lease " + std::to_string(m.lease) + " over UCX is above 2^48 - 1 (its tags' lease bits)");
  }
  if (c.leases.size() >= options_.max_leases) {
    return refuse(ErrorCode::kBusy, "already " + std::to_string(c.leases.size()) + " open leases on this connection");
  }
  if (m.indices.size() > c.dataset->batch_size) {
    return refuse(ErrorCode::kInvalidArgument, std::to_string(m.indices.size()) + " indices for a batch size of " +
                                                   std::to_string(c.dataset->batch_size));
  }
  for (const std::uint64_t i : m.indices) {
    if (i >= c.dataset->layout.dataset_size) {
      return refuse(ErrorCode::kInvalidArgument, "sample index " + std::to_string(i) + " out of range (" +
                                                     std::to_string(c.dataset->layout.dataset_size) + " samples)");
    }
  }
  if (m.address != 0 && c.direct_pid == 0) {
    return refuse(ErrorCode::kBadRequest, "PRODUCE names a buffer address, but this connection is not direct");
  }
  if (m.address == 0 && c.direct_pid != 0) {
    return refuse(ErrorCode::kBadRequest, "PRODUCE on a direct connection without a buffer address");
  }
  c.leases.emplace(m.lease, Lease{LeaseState::kQueued, false, m.address});
  Job job{c.id, m.lease, m.epoch, m.batch, std::move(m.indices), c.dataset};
  if (c.python) return c.python->submit(std::move(job));
  executor_->submit(std::move(job));
}

void Server::on_cancel(Conn& c, std::uint64_t lease) {
  const auto it = c.leases.find(lease);
  // Not open: its BATCH_READY, ERROR or CANCELED went out already, and the
  // client will see that one.
  if (it == c.leases.end()) return;
  stats_.leases_canceled.fetch_add(1, std::memory_order_relaxed);
  const bool dequeued = c.python ? c.python->cancel_queued(lease) : executor_->cancel_queued(c.id, lease);
  if (it->second.state == LeaseState::kQueued && dequeued) {
    c.leases.erase(it);
    return reply(c, protocol::Canceled{lease});
  }
  // Being made or sent: CANCELED goes out once its buffer is ours again.
  it->second.canceled = true;
}

void Server::on_results() {
  for (JobResult& r : executor_->take_results()) {
    const auto ci = conns_.find(r.job.conn);
    Conn* c = ci == conns_.end() || ci->second->closed ? nullptr : ci->second.get();
    const auto li = c != nullptr ? c->leases.find(r.job.lease) : decltype(c->leases.end()){};
    if (c == nullptr || li == c->leases.end() || li->second.canceled || r.error) {
      if (r.staging.data) executor_->release(std::move(r.staging));
      if (c == nullptr || li == c->leases.end()) continue;
      if (li->second.canceled) {
        reply(*c, protocol::Canceled{r.job.lease});
      } else {
        reply(*c, *r.error);
      }
      c->leases.erase(li);
      continue;
    }
    if (li->second.address != 0) {
      const std::uint64_t address = li->second.address;
      c->leases.erase(li);
      write_direct(*c, r, address);
      continue;
    }
    li->second.state = LeaseState::kSending;
    // A Python batch's size is known only now: BATCH_READY goes first, and the
    // client posts its receive for that many bytes (see OffloadClient).
    const bool announce = r.job.dataset->python;
    if (announce) reply_ready(*c, r.ready);
    // The buffer rides with the callback, which gives it back when UCX is done with it.
    auto staging = std::make_shared<Staging>(std::move(r.staging));
    const std::byte* data = staging->data.get();
    ++sends_in_flight_;
    sender_->send(c->endpoint, data, Pieces{r.bytes, c->piece_bytes}, r.job.lease,
                 [this, staging, conn = c->id, lease = r.job.lease, ready = std::move(r.ready),
                  start = Clock::now(), announce](const std::optional<std::string>& error) mutable {
                   --sends_in_flight_;
                   if (!error) stats_.send.add(1, Clock::now() - start, ready.bytes);
                   if (executor_) executor_->release(std::move(*staging));
                   on_sent(conn, lease, std::move(ready), error, announce);
                 });
  }
}

// On the event loop, like closing a connection: once the client sees its
// connection closed, nothing more is written into it.
void Server::write_direct(Conn& c, JobResult& r, std::uint64_t address) {
  const auto start = Clock::now();
  iovec local{r.staging.data.get(), r.bytes};
  iovec remote{reinterpret_cast<void*>(address), r.bytes};
  const ssize_t wrote = ::process_vm_writev(static_cast<pid_t>(c.direct_pid), &local, 1, &remote, 1, 0);
  const int err = errno;
  executor_->release(std::move(r.staging));
  if (wrote == static_cast<ssize_t>(r.bytes)) {
    stats_.send.add(1, Clock::now() - start, r.ready.bytes);
    stats_.batches_ready.fetch_add(1, std::memory_order_relaxed);
    return reply_ready(c, r.ready);
  }
  stats_.batches_failed.fetch_add(1, std::memory_order_relaxed);
  const std::string why = "writing " + std::to_string(r.bytes) + " bytes into pid " + std::to_string(c.direct_pid) +
                          " failed: " + (wrote < 0 ? std::strerror(err) : "short write");
  if (wrote < 0 && err == ESRCH) return close_conn(c, "the trainer is gone (" + why + ")", false);
  reply(c, protocol::ErrorMsg{r.job.lease, ErrorCode::kInternal, why});
}

void Server::on_sent(std::uint64_t conn, std::uint64_t lease, protocol::BatchReady ready,
                     const std::optional<std::string>& error,
                     bool announced) {
  const auto ci = conns_.find(conn);
  if (ci == conns_.end() || ci->second->closed) return;
  Conn& c = *ci->second;
  const auto li = c.leases.find(lease);
  if (li == c.leases.end()) return;
  const bool canceled = li->second.canceled;
  c.leases.erase(li);
  if (error) {
    stats_.batches_failed.fetch_add(1, std::memory_order_relaxed);
    const std::string why = "sending the batch over UCX failed: " + *error;
    return reply(c, protocol::ErrorMsg{lease, ErrorCode::kInternal, why.substr(0, protocol::kMaxText)});
  }
  stats_.batches_ready.fetch_add(canceled ? 0 : 1, std::memory_order_relaxed);
  if (announced) return;  // BATCH_READY went before the data; a cancel came too late to matter
  if (canceled) return reply(c, protocol::Canceled{lease});
  reply_ready(c, std::move(ready));
}

void Server::reply_ready(Conn& c, protocol::BatchReady ready) {
  ready.busy = stats_.busy.fraction(protocol::BatchReady::kBusyWindow);
  reply(c, ready);
}

}  // namespace dlop::offload::daemon
