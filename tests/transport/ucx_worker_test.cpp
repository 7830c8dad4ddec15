// UcxWorker's own UCX settings: they take effect without UCX printing
// anything. UCX logs to the process's stdout, where a user's program (and
// test_multihost's rank protocol) writes its own lines.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <string>

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

}  // namespace
}  // namespace dlop::transport
