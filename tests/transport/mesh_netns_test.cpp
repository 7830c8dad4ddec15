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

}  // namespace
}  // namespace dlop::transport
