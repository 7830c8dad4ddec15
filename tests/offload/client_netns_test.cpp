// A batch crossing real TCP: the daemon in one network namespace, the client
// in another (two hosts of tests/common/netns), with UCX_TLS=tcp on both
// sides. Needs root (ip netns); skipped with the reason otherwise.
#include <gtest/gtest.h>

#include "netns_client.hpp"

namespace dlop::offload {
namespace {

using namespace std::chrono_literals;

// Runs in a child moved into namespace `ns`: one batch, checked bit for bit
// against the local pipeline. Exit code 0 when equal.
[[noreturn]] void client_in(const std::string& ns, const std::string& ip, std::uint16_t port, const std::string& folder,
                            const char* spec) {
  test::exit_in_netns(ns, [&] {
    // The data must cross the veth (TCP), not be written across processes.
    OffloadClient client(ip, port, test::kToken, {.name = "netns", .timeout = 30s, .worker = nullptr, .direct = false});
    const test::AskedBatch batch(client, folder, spec, 11, 4, 1, {5, 0, 3, 1, 4, 2});
    return batch.check(client);
  });
}

class OffloadNetns : public test::NetnsDaemonTest {};

TEST_F(OffloadNetns, BatchCrossesRealTcpBetweenNamespaces) {
  test::write_jpeg_folder(data_.path(), 6, 60, 80);
  const char* spec = R"({"ops": [{"op": "random_resized_crop", "size": 48}, {"op": "hflip"}]})";
  const std::uint16_t port = start_daemon();
  const pid_t pid = ::fork();
  if (pid == 0) client_in(hosts_->name(1), hosts_->address(0), port, folder(), spec);
  test::expect_child_succeeds(pid, 60s, "10: setns, 11: no ready batch, 12: bytes differ, 13: exception (stderr)");
}

}  // namespace
}  // namespace dlop::offload
