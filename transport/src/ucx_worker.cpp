#include "transport/ucx_worker.hpp"

#include <algorithm>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <net/if.h>
#include <poll.h>

#include "core/error.hpp"
#include "transport/detail/request_slot.hpp"

namespace dlop::transport {

void check_ucs(ucs_status_t status, const char* what) {
  if (status != UCS_OK) {
    throw_error(Errc::kTransport, fmt::format("{} failed: {}", what, ucs_status_string(status)));
  }
}

void UcxWorker::ContextDeleter::operator()(ucp_context* context) const { ucp_cleanup(context); }
void UcxWorker::WorkerDeleter::operator()(ucp_worker* worker) const { ucp_worker_destroy(worker); }

void UcxWorker::abandon() {
  // Kept reachable on purpose: the leak is deliberate, not one for LeakSanitizer to report.
  static std::mutex mutex;
  static std::vector<std::pair<ucp_worker*, ucp_context*>> abandoned;
  std::lock_guard lock(mutex);
  abandoned.emplace_back(worker_.release(), context_.release());
}

namespace {

// dlop's UCX settings. Each must be a ucp context setting: a transport's
// (such as TCP_TX_SEG_SIZE) is not applied through ucp_config_modify by UCX
// 1.13, which instead prints "invalid configuration" on the process's stdout
// when the worker is made (breaking users that read a rank's stdout).
std::vector<std::pair<std::string, std::string>> dlop_ucx_defaults() {
  return {
      // Fast-completion sends (only those to other hosts, Endpoints::send)
      // below this go eagerly (kRemoteEagerBytes).
      {"RNDV_SEND_NBR_THRESH", std::to_string(kRemoteEagerBytes)},
  };
}

// UCX's TCP transport cuts an eager message into TX_SEG_SIZE pieces (8 KiB
// sent, 64 KiB received by default), each packed, written, read and matched
// on its own. Across hosts dlop's ring chunks (256 KiB) go eagerly
// (kRemoteEagerBytes), and on 10 Gbit/s between 2-core hosts that per-piece
// CPU, not the link, set the all-reduce's time: with one segment per chunk a
// rank's CPU per byte halved (bench/results/multihost/).
// UCX 1.13 reads a transport's settings only from the environment when the
// worker opens its interfaces (ucp_config_modify warns on stdout instead), so
// the default goes there, once per process before the first worker, and
// only where TCP may be opened (UCX warns on stdout about unused variables).
// Values the user exported win.

// Whether UCX will open its TCP transport, as far as the user's UCX_TLS and
// UCX_NET_DEVICES say: otherwise UCX warns on stdout that the TCP variables
// are unused.
bool tcp_may_be_opened() {
  auto names = [](const char* list) {
    std::vector<std::string> out;
    std::string item;
    for (const char* c = list;; ++c) {
      if (*c == ',' || *c == '\0') {
        if (!item.empty()) out.push_back(item);
        item.clear();
        if (*c == '\0') return out;
      } else {
        item += *c;
      }
    }
  };
  if (const char* tls = std::getenv("UCX_TLS"); tls != nullptr) {
    const bool excluding = tls[0] == '^';
    const auto listed = names(excluding ? tls + 1 : tls);
    const bool tcp_named = std::find(listed.begin(), listed.end(), "tcp") != listed.end();
    const bool all_named = std::find(listed.begin(), listed.end(), "all") != listed.end();
    if (excluding ? tcp_named : !(tcp_named || all_named)) return false;
  }
  if (const char* devices = std::getenv("UCX_NET_DEVICES"); devices != nullptr) {
    const auto listed = names(devices);
    // TCP's devices are network interfaces; RDMA ones (mlx5_0:1) are not.
    return std::any_of(listed.begin(), listed.end(),
                       [](const std::string& d) { return d == "all" || ::if_nametoindex(d.c_str()) != 0; });
  }
  return true;
}

void set_tcp_defaults_in_environment() {
  static std::once_flag once;
  std::call_once(once, [] {
    // One size both ways (UCX wants receive segments no smaller than sent
    // ones), and none of it where the user chose either.
    if (std::getenv("UCX_TCP_TX_SEG_SIZE") != nullptr || std::getenv("UCX_TCP_RX_SEG_SIZE") != nullptr) return;
    if (!tcp_may_be_opened()) return;
    ::setenv("UCX_TCP_TX_SEG_SIZE", kTcpSegmentSize, /*overwrite=*/0);
    ::setenv("UCX_TCP_RX_SEG_SIZE", kTcpSegmentSize, /*overwrite=*/0);
  });
}

// How many times a worker is made when a device went away meanwhile, and the pause between.
constexpr int kOpenTries = 5;
constexpr std::chrono::milliseconds kOpenPause{100};

}  // namespace

UcxWorker::UcxWorker() : UcxWorker(Options{}) {}

UcxWorker::UcxWorker(const Options& options) {
  // UCX lists the network devices when the context is made and opens them
  // when the worker is: a device removed in between (another job's network
  // namespace or veth going away) fails the worker with "No such device".
  // A new context lists the devices as they are now.
  for (int attempt = 1;; ++attempt) {
    const ucs_status_t status = open(options);
    if (status != UCS_ERR_NO_DEVICE || attempt == kOpenTries) {
      check_ucs(status, "ucp_worker_create");
      break;
    }
    std::this_thread::sleep_for(kOpenPause);
  }
  if (options.wakeup) check_ucs(ucp_worker_get_efd(worker_.get(), &event_fd_), "ucp_worker_get_efd");
}

ucs_status_t UcxWorker::open(const Options& options) {
  worker_.reset();
  context_.reset();
  ucp_config_t* config = nullptr;
  check_ucs(ucp_config_read(nullptr, nullptr, &config), "ucp_config_read");
  auto settings = dlop_ucx_defaults();
  settings.insert(settings.end(), options.ucx_config.begin(), options.ucx_config.end());
  for (const auto& [name, value] : settings) {
    if (std::getenv(("UCX_" + name).c_str()) != nullptr) continue;
    const ucs_status_t modified = ucp_config_modify(config, name.c_str(), value.c_str());
    if (modified != UCS_OK) {
      ucp_config_release(config);
      check_ucs(modified, ("ucp_config_modify " + name).c_str());
    }
  }

  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_REQUEST_SIZE | UCP_PARAM_FIELD_REQUEST_INIT |
                      UCP_PARAM_FIELD_MT_WORKERS_SHARED;
  params.features = UCP_FEATURE_TAG | UCP_FEATURE_AM | UCP_FEATURE_RMA;
  if (options.wakeup) params.features |= UCP_FEATURE_WAKEUP;
  params.request_size = sizeof(detail::RequestSlot);
  params.request_init = &detail::RequestSlot::reset;
  params.mt_workers_shared = 0;
  ucp_context_h context = nullptr;
  const ucs_status_t status = ucp_init(&params, config, &context);
  ucp_config_release(config);
  check_ucs(status, "ucp_init");
  context_.reset(context);
  set_tcp_defaults_in_environment();

  // One thread drives the worker at a time, but not always the one that made it.
  ucp_worker_params_t worker_params{};
  worker_params.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  worker_params.thread_mode = UCS_THREAD_MODE_SERIALIZED;
  ucp_worker_h worker = nullptr;
  const ucs_status_t created = ucp_worker_create(context_.get(), &worker_params, &worker);
  if (created == UCS_OK) worker_.reset(worker);
  return created;
}

Bytes UcxWorker::address() const {
  ucp_address_t* address = nullptr;
  std::size_t length = 0;
  check_ucs(ucp_worker_get_address(worker_.get(), &address, &length), "ucp_worker_get_address");
  const auto* begin = reinterpret_cast<const std::uint8_t*>(address);
  Bytes bytes(begin, begin + length);
  ucp_worker_release_address(worker_.get(), address);
  return bytes;
}

bool UcxWorker::progress() {
  // One pass: callers loop themselves, and a second, empty pass per test()
  // costs a measurable share of a 0.2 us round trip.
  return ucp_worker_progress(worker_.get()) != 0;
}

bool UcxWorker::arm() {
  if (event_fd_ < 0) return false;
  const ucs_status_t status = ucp_worker_arm(worker_.get());
  if (status == UCS_ERR_BUSY) return false;  // events arrived meanwhile: progress them first
  check_ucs(status, "ucp_worker_arm");
  return true;
}

void UcxWorker::wait_for_events(std::chrono::milliseconds timeout) {
  while (progress()) {
  }
  if (!arm()) return;
  pollfd fd{event_fd_, POLLIN, 0};
  ::poll(&fd, 1, static_cast<int>(timeout.count()));
}

}  // namespace dlop::transport
