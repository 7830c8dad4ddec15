// Real dlop-offloader processes for the tests, and raw TCP connections to
// them for speaking (or breaking) the protocol frame by frame.
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <netinet/tcp.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "media/image_pipeline.hpp"
#include "media/source.hpp"
#include "media/test_data.hpp"
#include "offload/protocol.hpp"
#include "offload/protocol_auth.hpp"
#include "offload/protocol_messages.hpp"

#ifndef DLOP_OFFLOADER_PATH
#error "DLOP_OFFLOADER_PATH must name the dlop-offloader executable (tests/offload/CMakeLists.txt sets it)"
#endif

namespace dlop::offload::test {

// The media test data (make_image, write_file, TempDir) as test::.
using namespace media::test;

inline constexpr const char* kToken = "0123456789abcdef-test-token";

// Tests over both paths a batch takes, direct writes (the default on one
// host) and UCX (what other hosts use): INSTANTIATE_TEST_SUITE_P(DirectAndUcx,
// Suite, ::testing::Bool(), direct_or_ucx).
inline std::string direct_or_ucx(const ::testing::TestParamInfo<bool>& info) { return info.param ? "direct" : "ucx"; }

// The reference a daemon's image batch is checked against: the same batch
// made by the pipeline in this process, images (float32, 3 x side x side)
// then labels (int64), as the daemon sends them.
inline std::vector<std::byte> local_batch(const std::string& folder, const char* spec, std::uint64_t seed,
                                          std::size_t side, const std::vector<std::uint64_t>& indices,
                                          std::uint64_t epoch) {
  const std::unique_ptr<media::Source> source = media::open_source(folder);
  const media::ImagePipeline p = media::ImagePipeline::from_json(spec);
  const std::size_t sample = 3 * side * side * 4;
  std::vector<std::byte> images(indices.size() * sample);
  std::vector<std::int64_t> labels(indices.size());
  p.run_batch(*source, indices, seed, epoch, images, labels);
  images.resize(images.size() + labels.size() * 8);
  std::memcpy(images.data() + indices.size() * sample, labels.data(), labels.size() * 8);
  return images;
}

// A daemon on 127.0.0.1 with a fresh token file; killed with the object.
class DaemonProcess {
 public:
  // `prefix` runs the daemon through another command (e.g. `ip netns exec NS`);
  // `cwd`, when given, is its working directory (a relative source path is
  // found there); `stderr_path`, when given, receives its log.
  explicit DaemonProcess(int threads = 2, std::vector<std::string> extra = {}, std::vector<std::string> env = {},
                         const std::string& listen = "127.0.0.1:0", std::vector<std::string> prefix = {},
                         const std::filesystem::path& cwd = {}, const std::filesystem::path& stderr_path = {}) {
    token_file_ = dir_.path() / "token";
    {
      std::ofstream(token_file_) << kToken << "\n";
    }
    ::chmod(token_file_.c_str(), 0600);
    int out[2];
    if (::pipe2(out, O_CLOEXEC) != 0) throw std::runtime_error("pipe");
    std::vector<std::string> args = std::move(prefix);
    for (std::string a : {std::string(DLOP_OFFLOADER_PATH), std::string("--listen"), listen, std::string("--token-file"),
                          token_file_.string(), std::string("--threads"), std::to_string(threads)}) {
      args.push_back(std::move(a));
    }
    args.insert(args.end(), extra.begin(), extra.end());
    pid_ = ::fork();
    if (pid_ == 0) {
      ::dup2(out[1], STDOUT_FILENO);
      if (!stderr_path.empty()) {
        const int err = ::open(stderr_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
        if (err < 0 || ::dup2(err, STDERR_FILENO) < 0) ::_exit(126);
      }
      if (!cwd.empty() && ::chdir(cwd.c_str()) != 0) ::_exit(126);
      for (const auto& e : env) ::putenv(const_cast<char*>(e.c_str()));
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
    ::close(out[1]);
    // The daemon prints its port once it listens.
    std::string line;
    pollfd p{out[0], POLLIN, 0};
    while (line.find('\n') == std::string::npos && ::poll(&p, 1, 20000) > 0) {
      char buf[256];
      const ssize_t n = ::read(out[0], buf, sizeof(buf));
      if (n <= 0) break;
      line.append(buf, static_cast<std::size_t>(n));
    }
    ::close(out[0]);
    const auto colon = line.rfind(':');
    if (line.find("listening on") == std::string::npos || colon == std::string::npos) {
      throw std::runtime_error("dlop-offloader did not start: '" + line + "'");
    }
    port_ = static_cast<std::uint16_t>(std::stoi(line.substr(colon + 1)));
    // "dlop-offloader (metrics on HOST:M) listening on HOST:PORT" with --metrics-port.
    if (const auto m = line.find("(metrics on "); m != std::string::npos) {
      metrics_port_ = static_cast<std::uint16_t>(std::stoi(line.substr(line.find(':', m) + 1)));
    }
  }
  ~DaemonProcess() {
    if (pid_ > 0 && running()) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }
  DaemonProcess(const DaemonProcess&) = delete;
  DaemonProcess& operator=(const DaemonProcess&) = delete;

  std::uint16_t port() const { return port_; }
  std::uint16_t metrics_port() const { return metrics_port_; }  // 0: no --metrics-port
  pid_t pid() const { return pid_; }
  bool running() {
    if (exited_) return false;
    int status = 0;
    if (::waitpid(pid_, &status, WNOHANG) == pid_) exited_ = true;
    return !exited_;
  }
  void kill(int sig) {
    ::kill(pid_, sig);
  }
  // Waits for the daemon to exit; its wait status, or nullopt after `timeout`.
  std::optional<int> wait_exit(std::chrono::milliseconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < deadline) {
      int status = 0;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        exited_ = true;
        return status;
      }
      ::usleep(10000);
    }
    return std::nullopt;
  }
  const std::filesystem::path& dir() const { return dir_.path(); }

 private:
  TempDir dir_;
  std::filesystem::path token_file_;
  pid_t pid_ = -1;
  bool exited_ = false;
  std::uint16_t port_ = 0;
  std::uint16_t metrics_port_ = 0;
};

// A plain blocking TCP connection to a daemon, for writing whatever bytes a
// test wants and checking how the daemon reacts.
class RawConn {
 public:
  explicit RawConn(std::uint16_t port) {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) throw std::runtime_error("connect");
  }
  ~RawConn() {
    if (fd_ >= 0) ::close(fd_);
  }
  RawConn(const RawConn&) = delete;
  RawConn& operator=(const RawConn&) = delete;

  // False if the daemon already closed (EPIPE/ECONNRESET).
  bool write(std::span<const std::uint8_t> bytes) {
    std::size_t sent = 0;
    while (sent < bytes.size()) {
      const ssize_t n = ::send(fd_, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
      if (n <= 0) return false;
      sent += static_cast<std::size_t>(n);
    }
    return true;
  }
  void close() {
    ::close(fd_);
    fd_ = -1;
  }
  int fd() const { return fd_; }
  // Reads until a whole frame is decoded; nullopt on EOF or timeout.
  std::optional<protocol::Frame> read_frame(std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (true) {
      if (auto f = decoder.next()) return f;
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      pollfd p{fd_, POLLIN, 0};
      if (left.count() <= 0 || ::poll(&p, 1, static_cast<int>(left.count())) <= 0) return std::nullopt;
      std::uint8_t buf[4096];
      const ssize_t n = ::recv(fd_, buf, sizeof(buf), 0);
      if (n <= 0) return std::nullopt;
      decoder.feed(std::span(buf, static_cast<std::size_t>(n)));
    }
  }
  // True if the daemon closes the connection within `timeout` (whatever it
  // sent before is read and dropped).
  bool closed_by_peer(std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (true) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      pollfd p{fd_, POLLIN, 0};
      if (left.count() <= 0 || ::poll(&p, 1, static_cast<int>(left.count())) <= 0) return false;
      std::uint8_t buf[4096];
      const ssize_t n = ::recv(fd_, buf, sizeof(buf), 0);
      if (n <= 0) return true;
    }
  }
  // Completes the handshake as a client with `token`; keys installed in
  // writer and decoder. Returns the WELCOME, or nullopt if refused.
  std::optional<protocol::Welcome> authenticate(const std::string& token = kToken) {
    const auto challenge_frame = read_frame();
    if (!challenge_frame) return std::nullopt;
    const auto challenge = protocol::decode<protocol::Challenge>(challenge_frame->payload);
    protocol::Hello hello;
    hello.client_nonce = protocol::random_nonce();
    hello.proof = protocol::hello_proof(token, challenge.server_nonce, hello.client_nonce);
    hello.client_name = "raw test client";
    write(writer.encode(protocol::MsgType::kHello, protocol::encode(hello)));
    const auto keys = protocol::session_keys(token, challenge.server_nonce, hello.client_nonce);
    writer.set_key(keys.client_to_server);
    decoder.set_key(keys.server_to_client);
    const auto welcome = read_frame();
    if (!welcome || welcome->type != protocol::MsgType::kWelcome) return std::nullopt;
    return protocol::decode<protocol::Welcome>(welcome->payload);
  }

  protocol::FrameWriter writer;
  protocol::FrameDecoder decoder;

 private:
  int fd_ = -1;
};

}  // namespace dlop::offload::test
