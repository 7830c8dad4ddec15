// A small TCP key/value store of our own: one server, held by one process of
// the job (or by a daemon), and a Store client per process. Used where there is
// no shared file system and no c10d Store, e.g. by the MPI bootstrap and the
// offloader daemons.
//
// The server keeps every key in memory until it is erased or the server is
// destroyed. It trusts nothing from the network: a client that sends a
// malformed or oversized message, or dies mid-message, loses only its own
// connection; the server and the keys stay.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>

#include "core/error.hpp"
#include "transport/store.hpp"

namespace dlop::transport {

// Largest key and value the store accepts; longer ones are refused by the
// client (kInvalidArgument) and end the connection on the server.
inline constexpr std::size_t kTcpStoreMaxKey = 4 * 1024;
inline constexpr std::size_t kTcpStoreMaxValue = 64 * 1024 * 1024;

// Serves the store on one background thread named "dlop-store".
class TcpStoreServer {
 public:
  // Binds host:port (port 0: an ephemeral port, see port()) and starts serving.
  // "0.0.0.0" listens on every interface. Throws dlop::Error(kSystem) naming
  // host:port when it cannot bind.
  explicit TcpStoreServer(std::string host = "127.0.0.1", std::uint16_t port = 0);
  // Stops the thread and closes every connection; the keys are lost.
  ~TcpStoreServer();
  TcpStoreServer(const TcpStoreServer&) = delete;
  TcpStoreServer& operator=(const TcpStoreServer&) = delete;

  const std::string& host() const { return host_; }
  // The port actually bound.
  std::uint16_t port() const { return port_; }

 private:
  class Loop;  // the state owned by the server thread (tcp_store.cpp)

  std::string host_;
  std::uint16_t port_ = 0;
  std::unique_ptr<Loop> loop_;
  std::thread thread_;
};

// A Store over one TCP connection to a TcpStoreServer. Thread-safe: calls are
// serialised on the connection. A get() waits on the server, not by polling.
class TcpStoreClient : public Store {
 public:
  // Retries connecting until connect_timeout passes (the server may start
  // later), then throws dlop::Error(kTimeout) naming host:port.
  TcpStoreClient(std::string host, std::uint16_t port, std::chrono::milliseconds connect_timeout);
  ~TcpStoreClient() override;
  TcpStoreClient(const TcpStoreClient&) = delete;
  TcpStoreClient& operator=(const TcpStoreClient&) = delete;

  // Errors: kInvalidArgument for a key or value over the limits; kTransport
  // naming host:port once the connection is broken (the client does not
  // reconnect); kProtocol when the server answers nonsense or refuses (e.g.
  // add() on a value that is not a decimal integer).
  void set(const std::string& key, const Bytes& value) override;
  // Throws kTimeout naming the key when it is not set within timeout.
  Bytes get(const std::string& key, std::chrono::milliseconds timeout) override;
  // The value is kept as decimal text, as FileStore does.
  std::int64_t add(const std::string& key, std::int64_t delta) override;
  bool erase(const std::string& key) override;

  const std::string& host() const { return host_; }
  std::uint16_t port() const { return port_; }

 private:
  struct Reply;
  Reply call(std::uint8_t op, const std::string& key, const Bytes* value, std::int64_t arg,
             std::chrono::milliseconds extra_wait);
  [[noreturn]] void fail(Errc code, const std::string& what);  // closes the connection

  std::string host_;
  std::uint16_t port_;
  std::mutex mutex_;
  int fd_ = -1;  // -1 once the connection is broken
};

// Splits "host:port" (the host may be "[v6addr]"); throws
// dlop::Error(kInvalidArgument) quoting the text when it is malformed.
std::pair<std::string, std::uint16_t> parse_host_port(const std::string& text);

}  // namespace dlop::transport
