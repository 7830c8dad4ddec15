#include "launch.hpp"

#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <iostream>
#include <vector>

#include "core/config.hpp"
#include "core/config_features.hpp"
#include "core/error.hpp"
#include "transport/tcp_store.hpp"
#if DLOP_HAVE_MPI
#include "transport/mpi_bootstrap.hpp"
#endif

namespace dlop::bench {
namespace {

int run_with_store(const std::string& host, std::uint16_t port, int rank, int size, const RankMain& body) {
  auto store = std::make_shared<transport::TcpStoreClient>(host, port, config().timeout);
  transport::Bootstrap bootstrap(store, rank, size);
  return body(bootstrap);
}

int run_forked(int size, const RankMain& body) {
  std::vector<pid_t> children;
  std::vector<int> pipes;
  std::cout.flush();
  for (int rank = 0; rank < size; ++rank) {
    int fds[2];
    if (::pipe(fds) != 0) throw_errno("pipe");
    const pid_t pid = ::fork();
    if (pid < 0) throw_errno("fork");
    if (pid == 0) {
      ::close(fds[1]);
      std::uint16_t port = 0;
      if (::read(fds[0], &port, sizeof(port)) != sizeof(port)) std::_Exit(3);
      int code = 1;
      try {
        code = run_with_store("127.0.0.1", port, rank, size, body);
      } catch (const std::exception& e) {
        std::cerr << "dlop-bench rank " << rank << ": " << e.what() << std::endl;
      }
      std::cout.flush();
      std::_Exit(code);
    }
    ::close(fds[0]);
    children.push_back(pid);
    pipes.push_back(fds[1]);
  }
  // The store's thread starts only now, after every fork.
  transport::TcpStoreServer server("127.0.0.1", 0);
  const std::uint16_t port = server.port();
  for (const int fd : pipes) {
    if (::write(fd, &port, sizeof(port)) != sizeof(port)) throw_errno("write");
    ::close(fd);
  }
  int worst = 0;
  for (const pid_t pid : children) {
    int status = 0;
    ::waitpid(pid, &status, 0);
    const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    worst = std::max(worst, code);
  }
  return worst;
}

}  // namespace

bool launched_by_mpi() {
  return std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr || std::getenv("PMI_SIZE") != nullptr ||
         std::getenv("PMIX_RANK") != nullptr;
}

int launch(const LaunchOptions& options, const RankMain& body) {
  if (options.local > 0) return run_forked(options.local, body);
  if (!options.store.empty()) {
    if (options.rank < 0 || options.size < 1) {
      throw_error(Errc::kInvalidArgument, "--store needs --rank and --size");
    }
    const auto [host, port] = transport::parse_host_port(options.store);
    std::unique_ptr<transport::TcpStoreServer> server;
    if (options.rank == 0) server = std::make_unique<transport::TcpStoreServer>(host, port);
    return run_with_store(host, port, options.rank, options.size, body);
  }
  if (launched_by_mpi()) {
#if DLOP_HAVE_MPI
    transport::MpiBootstrap bootstrap;
    return body(bootstrap);
#else
    throw_error(Errc::kInvalidArgument, "started by mpirun, but this dlop-bench was built without MPI");
#endif
  }
  throw_error(Errc::kInvalidArgument,
              "no peers: run under mpirun, give --rank/--size/--store, or --local N to fork N ranks here");
}

}  // namespace dlop::bench
