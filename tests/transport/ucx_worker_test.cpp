// UcxWorker's own UCX settings: they take effect without UCX printing
// anything. UCX logs to the process's stdout, where a user's program (and
// test_multihost's rank protocol) writes its own lines.
#include <gtest/gtest.h>

#include <sched.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include "transport/ucx_worker.hpp"

namespace dlop::transport {
namespace {

// The segment size the environment held when the process started: a user's
// value, which dlop's default must leave alone.
const char* const kSentSegmentAtStart = std::getenv("UCX_TCP_TX_SEG_SIZE");
const char* const kReceivedSegmentAtStart = std::getenv("UCX_TCP_RX_SEG_SIZE");
const bool kUserChoseSegments = kSentSegmentAtStart != nullptr || kReceivedSegmentAtStart != nullptr;

// What UCX printed on stdout while a worker with these extra settings was made.
std::string stdout_of_making_a_worker(const UcxWorker::Options& options) {
  testing::internal::CaptureStdout();
  { UcxWorker worker(options); }
  std::fflush(nullptr);
  return testing::internal::GetCapturedStdout();
}

TEST(UcxWorker, DlopsSettingsAreAppliedWithoutAWordOnStdout) {
  EXPECT_EQ(stdout_of_making_a_worker({}), "");
}

// UCX reads TCP's segment size from the environment when a worker opens its
// interfaces: after a worker is made, dlop's default is there unless the user
// gave one.
TEST(UcxWorker, TcpSegmentSizesAreInTheEnvironmentUnlessTheUserChoseOne) {
  if (std::getenv("UCX_TLS") != nullptr || std::getenv("UCX_NET_DEVICES") != nullptr) {
    GTEST_SKIP() << "UCX_TLS or UCX_NET_DEVICES is set: TCP may be left out";
  }
  { UcxWorker worker; }
  auto now = [](const char* name) { const char* v = std::getenv(name); return std::string(v ? v : "(unset)"); };
  if (kUserChoseSegments) {
    EXPECT_EQ(now("UCX_TCP_TX_SEG_SIZE"), kSentSegmentAtStart ? kSentSegmentAtStart : "(unset)");
    EXPECT_EQ(now("UCX_TCP_RX_SEG_SIZE"), kReceivedSegmentAtStart ? kReceivedSegmentAtStart : "(unset)");
  } else {
    EXPECT_EQ(now("UCX_TCP_TX_SEG_SIZE"), kTcpSegmentSize);
    EXPECT_EQ(now("UCX_TCP_RX_SEG_SIZE"), kTcpSegmentSize);
  }
}

// The other side of the stdout test: a setting UCX does not apply this way (a
// transport's, as dlop once gave) is reported on stdout, and the capture sees it.
TEST(UcxWorker, ATransportSettingGivenForTheContextIsReportedOnStdout) {
  if (std::getenv("UCX_TCP_SNDBUF") != nullptr) GTEST_SKIP() << "UCX_TCP_SNDBUF is set";
  UcxWorker::Options options;
  options.ucx_config = {{"TCP_SNDBUF", "1m"}};
  EXPECT_NE(stdout_of_making_a_worker(options).find("TCP_SNDBUF"), std::string::npos);
}

// Another job's network device may go away between UCX listing the devices
// (the context) and opening them (the worker): the worker is made anyway. In
// a network namespace of its own, a thread adds and removes a veth with an
// address while workers are made; every one must come up. Without the retry
// about one in fifteen failed here with "No such device".
TEST(UcxWorker, WorkersComeUpWhileDevicesComeAndGo) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root for a network namespace of its own";
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // UCX reads the devices' attributes in /sys/class/net, which shows the
    // namespace that mounted it: a sysfs of this namespace's own.
    if (::unshare(CLONE_NEWNET | CLONE_NEWNS) != 0 ||
        std::system("mount --make-rprivate / && mount -t sysfs sysfs /sys && ip link set lo up") != 0) {
      ::_exit(100);
    }
    std::atomic<bool> stop{false};
    std::atomic<int> cycles{0};
    std::thread churn([&] {
      while (!stop) {
        cycles += std::system(
                      "(ip link add dlopchurn type veth peer name dlopchurnp && "
                      "ip addr add 10.99.0.1/24 dev dlopchurn && ip link set dlopchurn up && "
                      "ip link set dlopchurnp up && ip link del dlopchurn) >/dev/null 2>&1") == 0;
      }
    });
    int failed = 0;
    for (int i = 0; i < 100; ++i) {
      try {
        UcxWorker worker(UcxWorker::Options{.wakeup = false});
      } catch (const std::exception& e) {
        std::fprintf(stderr, "worker %d: %s\n", i, e.what());
        ++failed;
      }
    }
    stop = true;
    churn.join();
    ::_exit(cycles == 0 ? 101 : failed);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  if (WEXITSTATUS(status) == 100) GTEST_SKIP() << "cannot make a network namespace here";
  ASSERT_NE(WEXITSTATUS(status), 101) << "no device came and went: ip link add ... type veth failed";
  EXPECT_EQ(WEXITSTATUS(status), 0) << "workers that did not come up (their errors are above)";
}

}  // namespace
}  // namespace dlop::transport
