#include "transport/ucx_worker.hpp"

#include <cstdlib>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

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

}  // namespace

UcxWorker::UcxWorker() : UcxWorker(Options{}) {}

UcxWorker::UcxWorker(const Options& options) {
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

  // One thread drives the worker at a time, but not always the one that made it.
  ucp_worker_params_t worker_params{};
  worker_params.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  worker_params.thread_mode = UCS_THREAD_MODE_SERIALIZED;
  ucp_worker_h worker = nullptr;
  check_ucs(ucp_worker_create(context_.get(), &worker_params, &worker), "ucp_worker_create");
  worker_.reset(worker);

  if (options.wakeup) check_ucs(ucp_worker_get_efd(worker_.get(), &event_fd_), "ucp_worker_get_efd");
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
