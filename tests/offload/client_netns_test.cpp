// A batch crossing real TCP: the daemon in one network namespace, the client
// in another (two hosts of tests/common/netns), with UCX_TLS=tcp on both
// sides. Needs root (ip netns); skipped with the reason otherwise.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>

#include "common/netns.hpp"
#include "daemon_harness.hpp"
#include "media/codec.hpp"
#include "media/image_pipeline.hpp"
#include "media/source.hpp"
#include "offload/offload_client.hpp"

namespace dlop::offload {
namespace {

using namespace std::chrono_literals;

// Runs in a child moved into namespace `ns`: one batch, checked bit for bit
// against the local pipeline. Exit code 0 when equal.
[[noreturn]] void client_in(const std::string& ns, const std::string& ip, std::uint16_t port, const std::string& folder,
                            const char* spec) {
  if (const std::string error = dlop::test::enter_netns(ns); !error.empty()) {
    std::fprintf(stderr, "%s\n", error.c_str());
    ::_exit(10);
  }
  ::setenv("UCX_TLS", "tcp", 1);
  try {
    // The data must cross the veth (TCP), not be written across processes.
    OffloadClient client(ip, port, test::kToken, {.name = "netns", .timeout = 30s, .worker = nullptr, .direct = false});
    const BatchLayout& layout = client.configure({folder, spec, 11, 6});
    std::vector<std::byte> buf(layout.batch_bytes);
    const std::vector<std::uint64_t> idx = {5, 0, 3, 1, 4, 2};
    client.produce(1, 4, 0, idx, buf.data(), buf.size());
    const auto c = client.wait(30s);
    if (!c || c->status != Completion::Status::kReady || c->count != idx.size()) ::_exit(11);
    std::vector<std::byte> images(idx.size() * layout.sample_bytes);
    std::vector<std::int64_t> labels(idx.size());
    media::ImagePipeline::from_json(spec).run_batch(*media::open_source(folder), idx, 11, 4, images, labels);
    const bool same = std::memcmp(buf.data(), images.data(), images.size()) == 0 &&
                      std::memcmp(buf.data() + layout.labels_offset, labels.data(), labels.size() * 8) == 0;
    ::_exit(same ? 0 : 12);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "client in %s: %s\n", ns.c_str(), e.what());
    ::_exit(13);
  }
}

TEST(OffloadNetns, BatchCrossesRealTcpBetweenNamespaces) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to make network namespaces (ip netns)";
  dlop::test::NetnsHosts hosts(2);
  if (!hosts.failed().empty()) GTEST_SKIP() << "cannot make network namespaces here: " << hosts.failed();
  test::TempDir data;
  for (int i = 0; i < 6; ++i) {
    test::write_file(data.path() / ("c" + std::to_string(i % 2)) / ("i" + std::to_string(i) + ".jpg"),
                     media::encode_jpeg(test::make_image(60 + i, 80, static_cast<std::uint32_t>(i)), 90));
  }
  const char* spec = R"({"ops": [{"op": "random_resized_crop", "size": 48}, {"op": "hflip"}]})";
  test::DaemonProcess d(1, {}, {"UCX_TLS=tcp"}, hosts.address(0) + ":0", {"/usr/sbin/ip", "netns", "exec", hosts.name(0)});
  const pid_t pid = ::fork();
  if (pid == 0) client_in(hosts.name(1), hosts.address(0), d.port(), data.path().string(), spec);
  int status = 0;
  for (int i = 0; i < 600 && ::waitpid(pid, &status, WNOHANG) == 0; ++i) ::usleep(100'000);
  if (::waitpid(pid, &status, WNOHANG) == 0) {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, &status, 0);
    FAIL() << "the client in the other namespace did not finish in 60 s";
  }
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "10: setns, 11: no ready batch, 12: bytes differ, 13: exception (stderr)";
}

}  // namespace
}  // namespace dlop::offload
