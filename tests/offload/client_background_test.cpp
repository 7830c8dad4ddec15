// Background progress: a batch from a daemon in another network namespace
// (UCX over TCP between two hosts of tests/common/netns) lands in the
// trainer's buffer while the trainer's thread sleeps, because a
// transport::ProgressThread drives the client's worker. Needs root (ip netns); skipped with the reason otherwise.
#include <gtest/gtest.h>

#include <thread>

#include "netns_client.hpp"
#include "transport/progress_thread.hpp"

namespace dlop::offload {
namespace {

using namespace std::chrono_literals;

// Runs in a child moved into namespace `ns`. Exit codes: 0 when the batch
// landed while this thread only slept and then matches the local pipeline.
[[noreturn]] void sleeping_trainer_in(const std::string& ns, const std::string& ip, std::uint16_t port,
                                      const std::string& folder, const char* spec) {
  test::exit_in_netns(ns, [&] {
    auto progress = std::make_shared<transport::ProgressThread>(OffloadClient::make_worker());
    OffloadClient client(ip, port, test::kToken,
                         {.name = "sleeper", .timeout = 30s, .worker = nullptr, .progress = progress, .direct = false});
    const test::AskedBatch batch(client, folder, spec, 7, 2, 9, {4, 2, 0, 3, 1});
    // The trainer "computes": no poll(), no wait(). landed() only looks.
    bool landed = false;
    for (int i = 0; i < 600 && !landed; ++i) {
      std::this_thread::sleep_for(50ms);
      landed = client.landed(9);
    }
    return landed ? batch.check(client) : 14;
  });
}

class OffloadBackgroundProgress : public test::NetnsDaemonTest {};

TEST_F(OffloadBackgroundProgress, BatchLandsFromAnotherHostWhileTheTrainerSleeps) {
  test::write_jpeg_folder(data_.path(), 5, 70, 90);
  // Big enough for UCX's rendezvous (which needs the receiver's progress).
  const char* spec = R"({"ops": [{"op": "random_resized_crop", "size": 64},
      {"op": "normalize", "mean": [0.5, 0.5, 0.5], "std": [0.25, 0.25, 0.25]}]})";
  const std::uint16_t port = start_daemon();
  const pid_t pid = ::fork();
  if (pid == 0) sleeping_trainer_in(hosts_->name(1), hosts_->address(0), port, folder(), spec);
  test::expect_child_succeeds(pid, 90s,
                              "10: setns, 11: no ready batch, 12: bytes differ, 13: exception (stderr), "
                              "14: the batch did not land while the trainer slept");
}

}  // namespace
}  // namespace dlop::offload
