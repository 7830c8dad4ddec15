#include "common/multiprocess.hpp"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <thread>

#include "transport/file_store.hpp"

namespace dlop::test {

std::string make_temp_dir() {
  std::string pattern = (std::filesystem::temp_directory_path() / "dlop-test-XXXXXX").string();
  if (::mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
  return pattern;
}

RankGroup::RankGroup(int size, RankBody body) : dir_(make_temp_dir()) {
  std::cout.flush();
  std::cerr.flush();
  for (int rank = 0; rank < size; ++rank) {
    const pid_t pid = ::fork();
    if (pid < 0) throw std::runtime_error("fork failed");
    if (pid == 0) {
      int code = 0;
      try {
        transport::Bootstrap bootstrap(std::make_shared<transport::FileStore>(dir_), rank, size);
        body(bootstrap);
        if (::testing::Test::HasFailure()) code = 1;
      } catch (const std::exception& e) {
        std::cerr << "rank " << rank << " threw: " << e.what() << std::endl;
        code = 2;
      }
      std::cout.flush();
      std::cerr.flush();
      std::_Exit(code);  // skip the parent's atexit handlers and gtest's reporting
    }
    pids_.push_back(pid);
  }
}

RankGroup::~RankGroup() {
  for (const pid_t pid : pids_) {
    if (pid > 0) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
    }
  }
  std::error_code ignored;
  std::filesystem::remove_all(dir_, ignored);
}

std::vector<RankExit> RankGroup::wait(std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::vector<RankExit> exits(pids_.size());
  for (std::size_t rank = 0; rank < pids_.size(); ++rank) {
    exits[rank].rank = static_cast<int>(rank);
    if (pids_[rank] <= 0) continue;
    int status = 0;
    while (::waitpid(pids_[rank], &status, WNOHANG) == 0) {
      if (std::chrono::steady_clock::now() > deadline) {
        ::kill(pids_[rank], SIGKILL);
        ::waitpid(pids_[rank], &status, 0);
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    exits[rank].exited = WIFEXITED(status);
    exits[rank].code = WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status);
    pids_[rank] = -1;
  }
  return exits;
}

void run_ranks(int size, const RankBody& body, std::chrono::milliseconds timeout) {
  RankGroup group(size, body);
  for (const RankExit& e : group.wait(timeout)) {
    if (e.exited) {
      EXPECT_EQ(e.code, 0) << "rank " << e.rank << " of " << size << " failed";
    } else {
      ADD_FAILURE() << "rank " << e.rank << " of " << size << " killed by signal " << e.code;
    }
  }
}

}  // namespace dlop::test
