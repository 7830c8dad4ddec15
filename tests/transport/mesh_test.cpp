// Tagged send/recv, puts and active messages between real processes.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>

#include "common/multiprocess.hpp"
#include "core/error.hpp"
#include "transport/mesh.hpp"

namespace dlop::transport {
namespace {

using namespace std::chrono_literals;

// A byte pattern that differs by sender, receiver, size and position.
std::uint8_t pattern(int src, int dst, std::size_t size, std::size_t i) {
  return static_cast<std::uint8_t>((i * 131u) ^ (static_cast<std::size_t>(src) * 29u) ^
                                   (static_cast<std::size_t>(dst) * 7u) ^ size);
}

std::vector<std::uint8_t> make_payload(int src, int dst, std::size_t size) {
  std::vector<std::uint8_t> data(size);
  for (std::size_t i = 0; i < size; ++i) data[i] = pattern(src, dst, size, i);
  return data;
}

// Index of the first wrong byte, or -1.
long first_mismatch(const std::vector<std::uint8_t>& got, int src, int dst, std::size_t size) {
  for (std::size_t i = 0; i < size; ++i) {
    if (got[i] != pattern(src, dst, size, i)) return static_cast<long>(i);
  }
  return -1;
}

constexpr std::size_t kSizes[] = {0, 1, 7, 4096, 1 << 20, (64u << 20) + 3};

class MeshGrid : public ::testing::TestWithParam<std::tuple<int, std::size_t>> {};

TEST_P(MeshGrid, SendRecvAllPairs) {
  const auto [ranks, size] = GetParam();
  test::run_ranks(ranks, [size](Bootstrap& b) {
    UcxWorker worker;
    Mesh mesh(worker, b);
    const int n = mesh.size();
    const int me = mesh.rank();
    std::vector<std::vector<std::uint8_t>> in(static_cast<std::size_t>(n), std::vector<std::uint8_t>(size + 1, 0xEE));
    std::vector<std::vector<std::uint8_t>> out(static_cast<std::size_t>(n));
    std::vector<Request> requests;
    for (int peer = 0; peer < n; ++peer) {
      if (peer == me) continue;
      requests.push_back(mesh.recv(peer, in[static_cast<std::size_t>(peer)].data(), size, 5));
      out[static_cast<std::size_t>(peer)] = make_payload(me, peer, size);
      requests.push_back(mesh.send(peer, out[static_cast<std::size_t>(peer)].data(), size, 5));
    }
    for (auto& r : requests) r.wait(60s);
    for (int peer = 0; peer < n; ++peer) {
      if (peer == me) continue;
      const auto& got = in[static_cast<std::size_t>(peer)];
      EXPECT_EQ(first_mismatch(got, peer, me, size), -1) << "from rank " << peer << " size " << size;
      EXPECT_EQ(got[size], 0xEE) << "wrote past the end";
    }
    for (std::size_t i = 0; i < requests.size(); i += 2) EXPECT_EQ(requests[i].received_bytes(), size);
  });
}

INSTANTIATE_TEST_SUITE_P(RanksBySizes, MeshGrid,
                         ::testing::Combine(::testing::Values(2, 3, 4), ::testing::ValuesIn(kSizes)),
                         [](const auto& param_info) {
                           return "ranks" + std::to_string(std::get<0>(param_info.param)) + "_bytes" +
                                  std::to_string(std::get<1>(param_info.param));
                         });

TEST(Mesh, LaterTagCompletesFirstWhileEarlierStaysPending) {
  test::run_ranks(2, [](Bootstrap& b) {
    UcxWorker worker;
    Mesh mesh(worker, b);
    std::uint64_t first = 0, second = 0;
    if (mesh.rank() == 0) {
      Request a = mesh.recv(1, &first, sizeof(first), 1);
      Request c = mesh.recv(1, &second, sizeof(second), 2);
      b.barrier(30s);  // both posted before anything is sent
      c.wait(30s);
      EXPECT_EQ(second, 222u);
      EXPECT_FALSE(a.test()) << "tag 1 completed with the message of tag 2";
      mesh.send(1, nullptr, 0, 3).wait(30s);  // now send tag 1
      a.wait(30s);
      EXPECT_EQ(first, 111u);
    } else {
      first = 111;
      second = 222;
      b.barrier(30s);
      mesh.send(0, &second, sizeof(second), 2).wait(30s);
      mesh.recv(0, nullptr, 0, 3).wait(30s);
      mesh.send(0, &first, sizeof(first), 1).wait(30s);
    }
  });
}

TEST(Mesh, HundredsInFlightWithShuffledTagsLandInTheirBuffers) {
  test::run_ranks(2, [](Bootstrap& b) {
    UcxWorker worker;
    Mesh mesh(worker, b);
    constexpr int kMessages = 300;
    auto size_of = [](int i) { return static_cast<std::size_t>((i * 7919) % 70000); };
    if (mesh.rank() == 0) {
      std::vector<std::vector<std::uint8_t>> in(kMessages);
      std::vector<Request> requests;
      for (int i = 0; i < kMessages; ++i) {
        in[static_cast<std::size_t>(i)].resize(size_of(i));
        requests.push_back(mesh.recv(1, in[static_cast<std::size_t>(i)].data(), size_of(i), static_cast<Tag>(1000 + i)));
      }
      b.barrier(30s);
      for (auto& r : requests) r.wait(60s);
      for (int i = 0; i < kMessages; ++i) {
        EXPECT_EQ(first_mismatch(in[static_cast<std::size_t>(i)], 1, i, size_of(i)), -1) << "tag " << 1000 + i;
        EXPECT_EQ(requests[static_cast<std::size_t>(i)].received_bytes(), size_of(i));
      }
    } else {
      std::vector<int> order(kMessages);
      std::iota(order.begin(), order.end(), 0);
      std::shuffle(order.begin(), order.end(), std::mt19937(42));
      std::vector<std::vector<std::uint8_t>> out(kMessages);
      std::vector<Request> requests;
      b.barrier(30s);
      for (const int i : order) {
        out[static_cast<std::size_t>(i)] = make_payload(1, i, size_of(i));
        requests.push_back(mesh.send(0, out[static_cast<std::size_t>(i)].data(), size_of(i), static_cast<Tag>(1000 + i)));
      }
      for (auto& r : requests) r.wait(60s);
    }
    mesh.fence(60s);
  });
}

TEST(Mesh, RecvAnyReportsTheSender) {
  test::run_ranks(3, [](Bootstrap& b) {
    UcxWorker worker;
    Mesh mesh(worker, b);
    if (mesh.rank() == 0) {
      std::vector<int> sources;
      for (int i = 0; i < 2; ++i) {
        std::int32_t value = -1;
        Request r = mesh.recv_any(&value, sizeof(value), 77);
        r.wait(30s);
        EXPECT_EQ(value, r.source() * 100) << "received " << r.received_bytes();
        sources.push_back(r.source());
      }
      std::sort(sources.begin(), sources.end());
      EXPECT_EQ(sources, (std::vector<int>{1, 2}));
    } else {
      const std::int32_t value = mesh.rank() * 100;
      mesh.send(0, &value, sizeof(value), 77).wait(30s);
    }
    mesh.fence(60s);
  });
}

TEST(Mesh, TruncatedAndCanceledReceivesAreErrors) {
  test::run_ranks(2, [](Bootstrap& b) {
    UcxWorker worker;
    Mesh mesh(worker, b);
    if (mesh.rank() == 0) {
      std::vector<std::uint8_t> small(8);
      Request r = mesh.recv(1, small.data(), small.size(), 3);
      try {
        r.wait(30s);
        ADD_FAILURE() << "a 64-byte message fit an 8-byte buffer";
      } catch (const Error& e) {
        EXPECT_EQ(e.code(), Errc::kProtocol) << e.what();
      }
      Request never = mesh.recv(1, small.data(), small.size(), 4);
      never.cancel();
      try {
        never.wait(5s);
        ADD_FAILURE() << "a canceled receive completed";
      } catch (const Error& e) {
        EXPECT_EQ(e.code(), Errc::kCanceled) << e.what();
      }
      try {
        mesh.recv(1, small.data(), small.size(), 5).wait(200ms);
        ADD_FAILURE() << "a receive with no sender completed";
      } catch (const Error& e) {
        EXPECT_EQ(e.code(), Errc::kTimeout);
        EXPECT_NE(std::string(e.what()).find("rank 1"), std::string::npos) << e.what();
      }
      EXPECT_THROW(mesh.send(1, small.data(), 1, kMaxUserTag + 1), Error);
    } else {
      const std::vector<std::uint8_t> big(64, 1);
      mesh.send(0, big.data(), big.size(), 3).wait(30s);
    }
    mesh.fence(60s);
  });
}

}  // namespace
}  // namespace dlop::transport
