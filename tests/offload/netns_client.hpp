// A client in another network namespace than its daemon (tests/common/netns):
// the image folder it asks for, its batch checked against the local pipeline,
// and the forked child's exit code read back.
#pragma once

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <memory>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "common/netns.hpp"
#include "daemon_harness.hpp"
#include "media/codec.hpp"
#include "offload/offload_client.hpp"

namespace dlop::offload::test {

// `count` JPEGs of (width + i) x height in two classes under `folder`.
inline void write_jpeg_folder(const std::filesystem::path& folder, int count, int width, int height) {
  for (int i = 0; i < count; ++i) {
    write_file(folder / ("c" + std::to_string(i % 2)) / ("i" + std::to_string(i) + ".jpg"),
               media::encode_jpeg(make_image(width + i, height, static_cast<std::uint32_t>(i)), 90));
  }
}

// Two hosts (network namespaces), an image folder and, once started, a
// daemon on host 0 where UCX speaks TCP only; skipped, saying why, where
// namespaces cannot be made.
class NetnsDaemonTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (::geteuid() != 0) GTEST_SKIP() << "needs root to make network namespaces (ip netns)";
    hosts_ = std::make_unique<dlop::test::NetnsHosts>(2);
    if (!hosts_->failed().empty()) GTEST_SKIP() << "cannot make network namespaces here: " << hosts_->failed();
  }
  // Starts the daemon; returns its port.
  std::uint16_t start_daemon() {
    daemon_ = std::make_unique<DaemonProcess>(1, std::vector<std::string>{}, std::vector<std::string>{"UCX_TLS=tcp"},
                                              hosts_->address(0) + ":0",
                                              std::vector<std::string>{"/usr/sbin/ip", "netns", "exec", hosts_->name(0)});
    return daemon_->port();
  }
  std::string folder() const { return data_.path().string(); }

  std::unique_ptr<dlop::test::NetnsHosts> hosts_;
  TempDir data_;
  std::unique_ptr<DaemonProcess> daemon_;
};

// Runs in a forked child: moves into network namespace `ns`, where UCX
// speaks TCP only, and exits with body()'s code; 10 when the namespace
// cannot be entered, 13 on an exception (printed to stderr).
template <typename Body>
[[noreturn]] void exit_in_netns(const std::string& ns, Body body) {
  if (const std::string error = dlop::test::enter_netns(ns); !error.empty()) {
    std::fprintf(stderr, "%s\n", error.c_str());
    ::_exit(10);
  }
  ::setenv("UCX_TLS", "tcp", 1);
  try {
    ::_exit(body());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "client in %s: %s\n", ns.c_str(), e.what());
    ::_exit(13);
  }
}

// Configures client for folder, spec and seed, then asks for lease `lease`:
// the samples idx of `epoch`, into a buffer of the layout's size.
struct AskedBatch {
  AskedBatch(OffloadClient& client, std::string source, const char* transform, std::uint64_t sample_seed,
             std::uint64_t in_epoch, std::uint64_t lease, std::vector<std::uint64_t> indices)
      : folder(std::move(source)), spec(transform), seed(sample_seed), epoch(in_epoch), idx(std::move(indices)),
        layout(client.configure({folder, spec, seed, static_cast<std::uint32_t>(idx.size())})),
        buf(layout.batch_bytes) {
    client.produce(lease, epoch, 0, idx, buf.data(), buf.size());
  }

  // Waits for the batch and compares it with the pipeline's in this process.
  // Returns a child's exit code: 0 equal, 11 no ready batch, 12 bytes differ.
  int check(OffloadClient& client) const {
    const auto c = client.wait(std::chrono::seconds(30));
    if (!c || c->status != Completion::Status::kReady || c->count != idx.size()) return 11;
    std::vector<std::byte> images(idx.size() * layout.sample_bytes);
    std::vector<std::int64_t> labels(idx.size());
    media::ImagePipeline::from_json(spec).run_batch(*media::open_source(folder), idx, seed, epoch, images, labels);
    const bool same = std::memcmp(buf.data(), images.data(), images.size()) == 0 &&
                      std::memcmp(buf.data() + layout.labels_offset, labels.data(), labels.size() * 8) == 0;
    return same ? 0 : 12;
  }

  std::string folder;
  const char* spec;
  std::uint64_t seed, epoch;
  std::vector<std::uint64_t> idx;
  const BatchLayout& layout;
  std::vector<std::byte> buf;
};

// Expects the child `pid` to exit with code 0 within `limit`; kills it
// otherwise. `codes` explains its other exit codes.
inline void expect_child_succeeds(pid_t pid, std::chrono::seconds limit, const std::string& codes) {
  int status = 0;
  const long polls = limit.count() * 10;
  for (long i = 0; i < polls && ::waitpid(pid, &status, WNOHANG) == 0; ++i) ::usleep(100'000);
  if (::waitpid(pid, &status, WNOHANG) == 0) {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, &status, 0);
    FAIL() << "the client in the other namespace did not finish in " << limit.count() << " s";
  }
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << codes;
}

}  // namespace dlop::offload::test
