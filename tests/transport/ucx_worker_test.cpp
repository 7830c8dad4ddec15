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

// The other side of the test above: a setting UCX does not apply this way (a
// transport's, as dlop once gave) is reported on stdout, and the capture sees it.
TEST(UcxWorker, ATransportSettingGivenForTheContextIsReportedOnStdout) {
  if (std::getenv("UCX_TCP_TX_SEG_SIZE") != nullptr) GTEST_SKIP() << "UCX_TCP_TX_SEG_SIZE is set";
  UcxWorker::Options options;
  options.ucx_config = {{"TCP_TX_SEG_SIZE", "64k"}};
  EXPECT_NE(stdout_of_making_a_worker(options).find("TCP_TX_SEG_SIZE"), std::string::npos);
}

}  // namespace
}  // namespace dlop::transport
