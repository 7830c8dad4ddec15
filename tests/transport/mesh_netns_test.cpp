// A mesh over two real hosts: ranks 0, 1 in one network namespace and 2, 3 in
// another (tests/common/netns). Ranks of a namespace are one host; ranks of
// two talk over TCP through the bridge. Needs root; skipped otherwise.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <vector>

#include "common/multiprocess.hpp"
#include "common/netns.hpp"
#include "transport/mesh.hpp"

namespace dlop::transport {
namespace {

using namespace std::chrono_literals;

TEST(MeshNetns, NamespacesAreHostsJoinedOverTcp) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to make network namespaces (ip netns)";
  test::NetnsHosts hosts(2);
  if (!hosts.failed().empty()) GTEST_SKIP() << "cannot make network namespaces here: " << hosts.failed();
  constexpr std::size_t kBytes = (1u << 20) + 3;
  test::run_ranks(4, [&hosts](Bootstrap& b) {
    const int host = b.rank() / 2;
    const std::string error = test::enter_netns(hosts.name(host));
    ASSERT_TRUE(error.empty()) << error;
    UcxWorker worker;
    Mesh mesh(worker, b);
    const int me = mesh.rank();
    std::vector<std::vector<std::uint8_t>> in(4, std::vector<std::uint8_t>(kBytes)), out(4);
    std::vector<Request> requests;
    for (int peer = 0; peer < 4; ++peer) {
      if (peer == me) continue;
      EXPECT_EQ(mesh.is_local(peer), peer / 2 == host) << "rank " << me << " -> " << peer << ": " << mesh.describe(peer);
      out[static_cast<std::size_t>(peer)].assign(kBytes, static_cast<std::uint8_t>(16 * me + peer));
      requests.push_back(mesh.recv(peer, in[static_cast<std::size_t>(peer)].data(), kBytes, 3));
      requests.push_back(mesh.send(peer, out[static_cast<std::size_t>(peer)].data(), kBytes, 3));
    }
    for (auto& r : requests) r.wait(60s);
    for (int peer = 0; peer < 4; ++peer) {
      if (peer == me) continue;
      EXPECT_EQ(in[static_cast<std::size_t>(peer)], std::vector<std::uint8_t>(kBytes, static_cast<std::uint8_t>(16 * peer + me)))
          << "from rank " << peer;
    }
    mesh.fence(60s);
  });
}

// A send to another host below kRemoteEagerBytes completes before the
// receiver posts its receive (eager: no rendezvous round trip), and every
// size around the threshold arrives intact. Rank 1 sends each payload, waits
// for its completion, then sends a marker; rank 0 waits for the marker (which
// progresses UCX, parking the payload as unexpected) before it posts the
// payload's receive. With a rendezvous the payload's send could not complete
// before that receive, and rank 1 would time out.
TEST(MeshNetns, SendsBelowTheEagerThresholdToAnotherHostDoNotWaitForTheReceiver) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to make network namespaces (ip netns)";
  test::NetnsHosts hosts(2);
  if (!hosts.failed().empty()) GTEST_SKIP() << "cannot make network namespaces here: " << hosts.failed();
  const std::vector<std::size_t> sizes = {0, 1, 4099, 256u << 10, (1u << 20) + 5, kRemoteEagerBytes - 1};
  test::run_ranks(2, [&hosts, &sizes](Bootstrap& b) {
    const std::string error = test::enter_netns(hosts.name(b.rank()));
    ASSERT_TRUE(error.empty()) << error;
    UcxWorker worker;
    Mesh mesh(worker, b);
    ASSERT_FALSE(mesh.is_local(1 - mesh.rank()));
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      const std::size_t bytes = sizes[i];
      const Tag payload_tag = 2 * i + 10;
      const Tag marker_tag = payload_tag + 1;
      std::uint32_t marker = 0;
      if (mesh.rank() == 1) {
        std::vector<std::uint8_t> out(bytes);
        for (std::size_t k = 0; k < bytes; ++k) out[k] = static_cast<std::uint8_t>(k * 7 + i);
        Request send = mesh.send(0, out.data(), bytes, payload_tag);
        EXPECT_NO_THROW(send.wait(10s)) << bytes << " B: the send waited for the receiver";
        marker = static_cast<std::uint32_t>(bytes);
        mesh.send(0, &marker, sizeof(marker), marker_tag).wait(20s);
      } else {
        mesh.recv(1, &marker, sizeof(marker), marker_tag).wait(30s);
        EXPECT_EQ(marker, bytes);
        std::vector<std::uint8_t> in(bytes + 1, 0xEE), expected(bytes + 1, 0xEE);
        for (std::size_t k = 0; k < bytes; ++k) expected[k] = static_cast<std::uint8_t>(k * 7 + i);
        Request recv = mesh.recv(1, in.data(), bytes, payload_tag);
        recv.wait(30s);
        EXPECT_EQ(recv.received_bytes(), bytes);
        EXPECT_EQ(in, expected) << bytes << " B";
      }
    }
    mesh.fence(60s);
  });
}

}  // namespace
}  // namespace dlop::transport
