// Remote objects over libcurl: ranged and streaming GETs, PUTs, each retried
// while its failure is transient (object_store.hpp says which are).
#include <curl/curl.h>
#include <unistd.h>

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>

#include "core/config.hpp"
#include "core/error.hpp"
#include "core/log.hpp"
#include "remote.hpp"

namespace dlop::media::store {
namespace {

using Clock = std::chrono::steady_clock;

// One easy handle per thread: curl_easy_reset keeps its connection cache,
// so a thread's requests to one server reuse their connection.
class Handle {
 public:
  Handle() {
    static std::once_flag once;
    std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
    curl_ = curl_easy_init();
    if (curl_ == nullptr) throw_error(Errc::kSystem, "libcurl: cannot create a handle");
  }
  ~Handle() { curl_easy_cleanup(curl_); }
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  CURL* get() {
    curl_easy_reset(curl_);
    return curl_;
  }

 private:
  CURL* curl_;
};

// A forked child (the trainer's local fallback workers) must not share its
// parent's connections: it leaves the inherited handle alone (cleaning it up
// could close what the parent still uses) and makes its own.
CURL* thread_handle() {
  thread_local std::unique_ptr<Handle> handle;
  thread_local pid_t owner = 0;
  if (owner != ::getpid()) {
    if (handle) static_cast<void>(handle.release());
    handle = std::make_unique<Handle>();
    owner = ::getpid();
  }
  return handle->get();
}

// What one attempt ended with.
struct Outcome {
  bool ok = false;
  bool transient = false;
  std::string why;
};

// One response's state, shared with libcurl's callbacks.
struct Transfer {
  CURL* curl = nullptr;
  std::uint64_t want = 0;  // the first byte wanted
  std::uint64_t pos = 0;   // where the body's next byte is in the object
  bool body_started = false;
  std::optional<std::uint64_t> range_start, range_total;
  std::optional<std::uint64_t> content_length;
  const ObjectReader::Chunk* sink = nullptr;
  bool stopped = false;   // the sink asked to stop
  bool bad_range = false;  // the server sent bytes after the first one wanted
  std::string error_body;  // of a failed response, for its message

  long status() const {
    long code = 0;
    curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &code);
    return code;
  }
};

std::size_t on_header(char* data, std::size_t size, std::size_t n, void* user) {
  auto& t = *static_cast<Transfer*>(user);
  const std::string line(data, size * n);
  if (line.rfind("HTTP/", 0) == 0) {  // a new response (after a redirect or a 100)
    t.range_start.reset();
    t.range_total.reset();
    t.content_length.reset();
  }
  const auto colon = line.find(':');
  if (colon == std::string::npos) return size * n;
  std::string name = line.substr(0, colon);
  std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  const std::string value = line.substr(colon + 1);
  unsigned long long a = 0, b = 0, total = 0;
  if (name == "content-range") {
    if (std::sscanf(value.c_str(), " bytes %llu-%llu/%llu", &a, &b, &total) == 3) {
      t.range_start = a;
      t.range_total = total;
    } else if (std::sscanf(value.c_str(), " bytes */%llu", &total) == 1) {
      t.range_total = total;
    }
  } else if (name == "content-length" && std::sscanf(value.c_str(), " %llu", &a) == 1) {
    t.content_length = a;
  }
  return size * n;
}

std::size_t on_body(char* data, std::size_t size, std::size_t n, void* user) {
  auto& t = *static_cast<Transfer*>(user);
  const std::size_t bytes = size * n;
  if (t.status() >= 300) {
    if (t.error_body.size() < 4096) t.error_body.append(data, std::min<std::size_t>(bytes, 4096));
    return bytes;
  }
  if (!t.body_started) {
    t.body_started = true;
    t.pos = t.range_start.value_or(0);  // 206, or 200 with Content-Range: from there; a plain 200: from 0
  }
  if (t.pos > t.want) {
    t.bad_range = true;
    return 0;
  }
  std::size_t skip = static_cast<std::size_t>(std::min<std::uint64_t>(t.want - t.pos, bytes));
  t.pos += bytes;
  if (skip == bytes) return bytes;  // a server that ignored the range: skip to the wanted bytes
  const std::span<const std::uint8_t> chunk(reinterpret_cast<const std::uint8_t*>(data) + skip, bytes - skip);
  t.want += chunk.size();
  if (t.sink != nullptr && !(*t.sink)(chunk)) {
    t.stopped = true;
    return 0;
  }
  return bytes;
}

// The text of an S3 error document's <tag>, or "".
std::string xml_field(const std::string& body, const std::string& tag) {
  const auto a = body.find("<" + tag + ">");
  const auto b = body.find("</" + tag + ">");
  if (a == std::string::npos || b == std::string::npos || b < a) return {};
  return body.substr(a + tag.size() + 2, b - a - tag.size() - 2);
}

std::string http_reason(long status, const std::string& body) {
  const std::string code = xml_field(body, "Code");
  const std::string message = xml_field(body, "Message");
  if (!code.empty()) return fmt::format("HTTP {} ({}{}{})", status, code, message.empty() ? "" : ": ", message);
  switch (status) {
    case 403: return "HTTP 403 (forbidden: check the credentials)";
    case 404: return "HTTP 404 (no such object)";
    default: return fmt::format("HTTP {}", status);
  }
}

bool transient_status(long status) { return status >= 500 || status == 429 || status == 408; }

bool transient_curl(CURLcode rc) {
  switch (rc) {
    case CURLE_COULDNT_CONNECT:
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_OPERATION_TIMEDOUT:
    case CURLE_SEND_ERROR:
    case CURLE_RECV_ERROR:
    case CURLE_GOT_NOTHING:
    case CURLE_PARTIAL_FILE:
    case CURLE_SSL_CONNECT_ERROR:
    case CURLE_HTTP2:
    case CURLE_HTTP2_STREAM:
      return true;
    default:
      return false;
  }
}

// The options every request has: the URL, timeouts, and for S3 the SigV4
// signature (its payload left unsigned, as S3 allows, so a PUT streams).
curl_slist* prepare(CURL* curl, const Target& target) {
  curl_easy_setopt(curl, CURLOPT_URL, target.url.c_str());
  curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT_MS, 5000L);
  // A server that stops sending is a timeout (transient), not a hang.
  curl_easy_setopt(curl, CURLOPT_LOW_SPEED_LIMIT, 1L);
  curl_easy_setopt(curl, CURLOPT_LOW_SPEED_TIME, 15L);
  curl_slist* headers = nullptr;
  if (target.s3) {
    const std::string sigv4 = "aws:amz:" + target.region + ":s3";
    curl_easy_setopt(curl, CURLOPT_AWS_SIGV4, sigv4.c_str());
    curl_easy_setopt(curl, CURLOPT_USERNAME, target.access_key.c_str());
    curl_easy_setopt(curl, CURLOPT_PASSWORD, target.secret_key.c_str());
    headers = curl_slist_append(headers, "x-amz-content-sha256: UNSIGNED-PAYLOAD");
    if (!target.session_token.empty()) {
      headers = curl_slist_append(headers, ("x-amz-security-token: " + target.session_token).c_str());
    }
  } else {
    curl_easy_setopt(curl, CURLOPT_FOLLOWLOCATION, 1L);
  }
  return headers;
}

// Runs `attempt` until it succeeds, fails permanently, or DLOP_STORE_RETRY_MS
// have passed; backoff from 50 ms, doubling up to 2 s.
void with_retries(const std::string& what, const std::function<Outcome()>& attempt) {
  const auto budget = config().store_retry;
  const auto deadline = Clock::now() + budget;
  auto backoff = std::chrono::milliseconds(50);
  for (int tries = 1;; ++tries) {
    const Outcome o = attempt();
    if (o.ok) return;
    if (!o.transient) throw_error(Errc::kInvalidArgument, fmt::format("{}: {}", what, o.why));
    const auto now = Clock::now();
    if (now >= deadline) {
      throw_error(Errc::kTransport, fmt::format("{}: {} (gave up after {} tries over {} ms, DLOP_STORE_RETRY_MS)", what,
                                                o.why, tries, budget.count()));
    }
    log().info("store: {}: {}; retrying in {} ms", what, o.why, backoff.count());
    std::this_thread::sleep_for(std::min<Clock::duration>(backoff, deadline - now));
    backoff = std::min(backoff * 2, std::chrono::milliseconds(2000));
  }
}

// One GET of bytes [offset, end) (end absent: to the object's end) into
// `sink`; `t` says how far it got.
Outcome get_once(const Target& target, std::uint64_t offset, std::optional<std::uint64_t> end, Transfer& t) {
  CURL* curl = thread_handle();
  t.curl = curl;
  t.pos = 0;
  t.want = offset;
  curl_slist* headers = prepare(curl, target);
  const std::string range = end ? fmt::format("{}-{}", offset, *end - 1) : fmt::format("{}-", offset);
  curl_easy_setopt(curl, CURLOPT_RANGE, range.c_str());
  curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers);
  curl_easy_setopt(curl, CURLOPT_HEADERFUNCTION, on_header);
  curl_easy_setopt(curl, CURLOPT_HEADERDATA, &t);
  curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, on_body);
  curl_easy_setopt(curl, CURLOPT_WRITEDATA, &t);
  const CURLcode rc = curl_easy_perform(curl);
  curl_slist_free_all(headers);
  const long status = t.status();
  if (t.bad_range) return {false, false, fmt::format("the server answered a range request from a later byte")};
  if (t.stopped) return {true, false, {}};
  if (rc != CURLE_OK) return {false, transient_curl(rc), fmt::format("{} (curl: {})", curl_easy_strerror(rc), static_cast<int>(rc))};
  if (status >= 300) return {false, transient_status(status), http_reason(status, t.error_body)};
  return {true, false, {}};
}

class HttpObject final : public ObjectReader {
 public:
  explicit HttpObject(Target target) : target_(std::move(target)) { size_ = fetch_size(); }

  const std::string& location() const override { return target_.location; }
  std::uint64_t size() const override { return size_; }

  void read(std::uint64_t offset, std::span<std::uint8_t> out) const override {
    if (out.empty()) return;
    check_bounds(offset, out.size());
    std::size_t filled = 0;
    // Stops only a server that sends more than asked: stopping a transfer
    // closes its connection, which the next read would reopen.
    const Chunk copy = [&](std::span<const std::uint8_t> chunk) {
      const std::size_t n = std::min(chunk.size(), out.size() - filled);
      std::copy_n(chunk.data(), n, out.data() + filled);
      filled += n;
      return n == chunk.size();
    };
    with_retries(fmt::format("GET {} bytes {}-{}", target_.location, offset, offset + out.size() - 1), [&] {
      Transfer t;
      t.sink = &copy;
      const Outcome o = get_once(target_, offset + filled, offset + out.size(), t);
      if (o.ok && filled < out.size()) return Outcome{false, true, "the body ended early"};
      return o;
    });
  }

  void stream(std::uint64_t offset, const Chunk& chunk) const override {
    if (offset >= size_) {
      check_bounds(offset, 0);
      return;
    }
    std::uint64_t next = offset;
    bool stopped = false;
    const Chunk counted = [&](std::span<const std::uint8_t> c) {
      next += c.size();
      stopped = !chunk(c);
      return !stopped;
    };
    with_retries(fmt::format("GET {} from byte {}", target_.location, offset), [&] {
      Transfer t;
      t.sink = &counted;
      const Outcome o = get_once(target_, next, std::nullopt, t);
      if (o.ok && !stopped && next < size_) return Outcome{false, true, "the body ended early"};
      return o;
    });
  }

 private:
  void check_bounds(std::uint64_t offset, std::uint64_t length) const {
    if (offset > size_ || length > size_ - offset) {
      throw_error(Errc::kInvalidArgument, fmt::format("{}: bytes {}+{} are past its end ({} bytes)", target_.location,
                                                      offset, length, size_));
    }
  }

  // The size from a one-byte range request's Content-Range (a HEAD would
  // carry no S3 error document to name a failure by).
  std::uint64_t fetch_size() const {
    std::uint64_t size = 0;
    std::uint64_t received = 0;  // a server that ignores the range is stopped after the first chunk
    const Chunk stop = [&](std::span<const std::uint8_t> c) { return (received += c.size()) <= 1; };
    with_retries(fmt::format("GET {}", target_.location), [&] {
      Transfer t;
      t.sink = &stop;
      Outcome o = get_once(target_, 0, 1, t);
      if (!o.ok && t.status() == 416 && t.range_total == 0u) o = {true, false, {}};  // an empty object
      if (!o.ok) return o;
      if (t.range_total) {
        size = *t.range_total;
      } else if (t.content_length && t.status() == 200) {
        size = *t.content_length;
      } else {
        return Outcome{false, false, "the answer has no size (no Content-Range or Content-Length)"};
      }
      return o;
    });
    return size;
  }

  Target target_;
  std::uint64_t size_ = 0;
};

}  // namespace

std::unique_ptr<ObjectReader> open_remote(const std::string& location) {
  return with_cache(std::make_unique<HttpObject>(resolve(location)));
}

void put_remote(const std::string& location, const std::filesystem::path& file) {
  const Target target = resolve(location);
  const auto size = std::filesystem::file_size(file);
  with_retries(fmt::format("PUT {}", location), [&] {
    std::FILE* in = std::fopen(file.c_str(), "rb");
    if (in == nullptr) throw_errno(fmt::format("PUT {}: cannot open {}", location, file.string()));
    CURL* curl = thread_handle();
    Transfer t;
    t.curl = curl;
    curl_slist* headers = prepare(curl, target);
    curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers);
    curl_easy_setopt(curl, CURLOPT_UPLOAD, 1L);
    curl_easy_setopt(curl, CURLOPT_READDATA, in);
    curl_easy_setopt(curl, CURLOPT_INFILESIZE_LARGE, static_cast<curl_off_t>(size));
    curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(curl, CURLOPT_WRITEDATA, &t);
    const CURLcode rc = curl_easy_perform(curl);
    curl_slist_free_all(headers);
    std::fclose(in);
    const long status = t.status();
    if (rc != CURLE_OK) return Outcome{false, transient_curl(rc), curl_easy_strerror(rc)};
    if (status >= 300) return Outcome{false, transient_status(status), http_reason(status, t.error_body)};
    return Outcome{true, false, {}};
  });
}

}  // namespace dlop::media::store
