// Background progress: a batch from a daemon in another network namespace
// (UCX over TCP through a veth pair) lands in the trainer's buffer while the
// trainer's thread sleeps, because a transport::ProgressThread drives the
// client's worker. Needs root (ip netns); skipped with the reason otherwise.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sched.h>
#include <sys/mount.h>

#include <cstdlib>
#include <cstring>
#include <thread>

#include "daemon_harness.hpp"
#include "media/codec.hpp"
#include "media/image_pipeline.hpp"
#include "media/source.hpp"
#include "offload/offload_client.hpp"
#include "transport/progress_thread.hpp"

namespace dlop::offload {
namespace {

using namespace std::chrono_literals;

// A copy of client_netns_test.cpp's (tests/common/ gets a shared one).
// Two namespaces "<a>" (10.213.N.1) and "<b>" (10.213.N.2) on one veth pair;
// removed with the object.
class NamespacePair {
 public:
  NamespacePair() {
    const int n = static_cast<int>(::getpid() % 200) + 1;
    a_ = "dlopA" + std::to_string(::getpid());
    b_ = "dlopB" + std::to_string(::getpid());
    server_ip_ = "10.213." + std::to_string(n) + ".1";
    const std::string client_ip = "10.213." + std::to_string(n) + ".2";
    const std::string va = "dva" + std::to_string(::getpid()), vb = "dvb" + std::to_string(::getpid());
    for (const std::string& cmd : {
             "ip netns add " + a_, "ip netns add " + b_,
             "ip link add " + va + " type veth peer name " + vb,
             "ip link set " + va + " netns " + a_, "ip link set " + vb + " netns " + b_,
             "ip -n " + a_ + " addr add " + server_ip_ + "/24 dev " + va,
             "ip -n " + b_ + " addr add " + client_ip + "/24 dev " + vb,
             "ip -n " + a_ + " link set " + va + " up", "ip -n " + b_ + " link set " + vb + " up",
             "ip -n " + a_ + " link set lo up", "ip -n " + b_ + " link set lo up"}) {
      if (std::system((cmd + " 2>/dev/null").c_str()) != 0) {
        failed_ = "'" + cmd + "' failed";
        return;
      }
    }
  }
  ~NamespacePair() {
    [[maybe_unused]] int rc = std::system(("ip netns del " + a_ + " 2>/dev/null").c_str());
    rc = std::system(("ip netns del " + b_ + " 2>/dev/null").c_str());
  }
  const std::string& failed() const { return failed_; }
  const std::string& a() const { return a_; }
  const std::string& b() const { return b_; }
  const std::string& server_ip() const { return server_ip_; }

 private:
  std::string a_, b_, server_ip_, failed_;
};

// Runs in a child moved into namespace `ns`. Exit codes: 0 when the batch
// landed while this thread only slept and then matches the local pipeline.
[[noreturn]] void sleeping_trainer_in(const std::string& ns, const std::string& ip, std::uint16_t port,
                                      const std::string& folder, const char* spec) {
  const int fd = ::open(("/run/netns/" + ns).c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0 || ::setns(fd, CLONE_NEWNET) != 0) ::_exit(10);
  // As `ip netns exec` does: UCX finds its network devices in /sys/class/net,
  // which shows the namespace sysfs was mounted in, so mount it afresh here.
  if (::unshare(CLONE_NEWNS) != 0 || ::mount("", "/", nullptr, MS_SLAVE | MS_REC, nullptr) != 0 ||
      ::umount2("/sys", MNT_DETACH) != 0 || ::mount("sysfs", "/sys", "sysfs", 0, nullptr) != 0) {
    ::_exit(10);
  }
  ::setenv("UCX_TLS", "tcp", 1);
  try {
    auto progress = std::make_shared<transport::ProgressThread>(OffloadClient::make_worker());
    OffloadClient client(ip, port, test::kToken,
                         {.name = "sleeper", .timeout = 30s, .worker = nullptr, .progress = progress, .direct = false});
    const BatchLayout& layout = client.configure({folder, spec, 7, 5});
    std::vector<std::byte> buf(layout.batch_bytes);
    const std::vector<std::uint64_t> idx = {4, 2, 0, 3, 1};
    client.produce(9, 2, 0, idx, buf.data(), buf.size());
    // The trainer "computes": no poll(), no wait(). landed() only looks.
    bool landed = false;
    for (int i = 0; i < 600 && !landed; ++i) {
      std::this_thread::sleep_for(50ms);
      landed = client.landed(9);
    }
    if (!landed) ::_exit(14);
    const auto c = client.wait(30s);
    if (!c || c->status != Completion::Status::kReady || c->count != idx.size()) ::_exit(11);
    std::vector<std::byte> images(idx.size() * layout.sample_bytes);
    std::vector<std::int64_t> labels(idx.size());
    media::ImagePipeline::from_json(spec).run_batch(*media::open_source(folder), idx, 7, 2, images, labels);
    const bool same = std::memcmp(buf.data(), images.data(), images.size()) == 0 &&
                      std::memcmp(buf.data() + layout.labels_offset, labels.data(), labels.size() * 8) == 0;
    ::_exit(same ? 0 : 12);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "client in %s: %s\n", ns.c_str(), e.what());
    ::_exit(13);
  }
}

TEST(OffloadBackgroundProgress, BatchLandsFromAnotherHostWhileTheTrainerSleeps) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to make network namespaces (ip netns)";
  NamespacePair ns;
  if (!ns.failed().empty()) GTEST_SKIP() << "cannot make network namespaces here: " << ns.failed();
  test::TempDir data;
  for (int i = 0; i < 5; ++i) {
    test::write_file(data.path() / ("c" + std::to_string(i % 2)) / ("i" + std::to_string(i) + ".jpg"),
                     media::encode_jpeg(test::make_image(70 + i, 90, static_cast<std::uint32_t>(i)), 90));
  }
  // Big enough for UCX's rendezvous (which needs the receiver's progress).
  const char* spec = R"({"ops": [{"op": "random_resized_crop", "size": 64},
      {"op": "normalize", "mean": [0.5, 0.5, 0.5], "std": [0.25, 0.25, 0.25]}]})";
  test::DaemonProcess d(1, {}, {"UCX_TLS=tcp"}, ns.server_ip() + ":0", {"/usr/sbin/ip", "netns", "exec", ns.a()});
  const pid_t pid = ::fork();
  if (pid == 0) sleeping_trainer_in(ns.b(), ns.server_ip(), d.port(), data.path().string(), spec);
  int status = 0;
  for (int i = 0; i < 900 && ::waitpid(pid, &status, WNOHANG) == 0; ++i) ::usleep(100'000);
  if (::waitpid(pid, &status, WNOHANG) == 0) {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, &status, 0);
    FAIL() << "the client in the other namespace did not finish in 90 s";
  }
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "10: setns, 11: no ready batch, 12: bytes differ, 13: exception (stderr), "
                                    << "14: the batch did not land while the trainer slept";
}

}  // namespace
}  // namespace dlop::offload
