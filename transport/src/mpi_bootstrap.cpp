#include "transport/mpi_bootstrap.hpp"

#include <netdb.h>
#include <unistd.h>

#include <climits>
#include <numeric>

#include "core/error.hpp"
#include "core/log.hpp"

namespace dlop::transport {

void check_mpi(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS) len = 0;
  throw_error(Errc::kTransport, fmt::format("{} failed: {}", what, std::string(text, static_cast<std::size_t>(len))));
}

namespace {

// The name other hosts can reach this one by, or 127.0.0.1 when it does not
// even resolve here.
std::string advertised_host() {
  char name[HOST_NAME_MAX + 1] = {};
  if (::gethostname(name, sizeof(name) - 1) != 0 || name[0] == '\0') return "127.0.0.1";
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (::getaddrinfo(name, nullptr, &hints, &found) != 0) {
    log().warn("mpi bootstrap: hostname '{}' does not resolve; serving the store on 127.0.0.1 (one host only)", name);
    return "127.0.0.1";
  }
  ::freeaddrinfo(found);
  return name;
}

// Rank 0 sends `text` (or an error) to every rank; the others return it.
std::string broadcast(MPI_Comm comm, std::string text) {
  int len = static_cast<int>(text.size());
  check_mpi(MPI_Bcast(&len, 1, MPI_INT, 0, comm), "MPI_Bcast");
  text.resize(static_cast<std::size_t>(len));
  check_mpi(MPI_Bcast(text.data(), len, MPI_CHAR, 0, comm), "MPI_Bcast");
  return text;
}

}  // namespace

struct MpiBootstrap::Setup {
  bool finalize = false;
  MPI_Comm comm = MPI_COMM_NULL;
  int rank = 0;
  int size = 1;
  std::unique_ptr<TcpStoreServer> server;
  std::string address;
  std::shared_ptr<Store> store;

  explicit Setup(std::chrono::milliseconds connect_timeout) {
    int flag = 0;
    check_mpi(MPI_Finalized(&flag), "MPI_Finalized");
    if (flag != 0) throw_error(Errc::kInvalidArgument, "mpi bootstrap: MPI is already finalised");
    check_mpi(MPI_Initialized(&flag), "MPI_Initialized");
    if (flag == 0) {
      int provided = 0;
      check_mpi(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided), "MPI_Init_thread");
      finalize = true;
      if (provided < MPI_THREAD_SERIALIZED) log().warn("mpi bootstrap: MPI gives thread level {} only", provided);
    }
    check_mpi(MPI_Comm_dup(MPI_COMM_WORLD, &comm), "MPI_Comm_dup");
    check_mpi(MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
    check_mpi(MPI_Comm_rank(comm, &rank), "MPI_Comm_rank");
    check_mpi(MPI_Comm_size(comm, &size), "MPI_Comm_size");

    // Rank 0 must reach the broadcast even when it cannot serve, or the
    // others would wait in it forever.
    std::string message;
    if (rank == 0) {
      try {
        server = std::make_unique<TcpStoreServer>("0.0.0.0", 0);
        message = fmt::format("ok {}:{}", advertised_host(), server->port());
      } catch (const std::exception& e) {
        message = fmt::format("error {}", e.what());
      }
    }
    message = broadcast(comm, message);
    if (message.starts_with("error ")) {
      throw_error(Errc::kTransport, fmt::format("mpi bootstrap: rank 0 could not serve the store: {}", message.substr(6)));
    }
    address = message.substr(3);
    const auto [host, port] = parse_host_port(address);
    store = std::make_shared<TcpStoreClient>(host, port, connect_timeout);
  }
};

MpiBootstrap::MpiBootstrap(std::chrono::milliseconds connect_timeout, std::string prefix)
    : MpiBootstrap(Setup(connect_timeout), std::move(prefix)) {}

MpiBootstrap::MpiBootstrap(Setup setup, std::string prefix)
    : Bootstrap(std::move(setup.store), setup.rank, setup.size, std::move(prefix)),
      finalize_(setup.finalize),
      comm_(setup.comm),
      server_(std::move(setup.server)),
      address_(std::move(setup.address)) {}

MpiBootstrap::~MpiBootstrap() {
  // Destructors must not throw: errors here are only logged.
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized != 0) {
    log().warn("mpi bootstrap: MPI was finalised before the bootstrap was destroyed");
    return;
  }
  if (MPI_Barrier(comm_) != MPI_SUCCESS) log().warn("mpi bootstrap: MPI_Barrier failed at shutdown");
  server_.reset();
  MPI_Comm_free(&comm_);
  if (finalize_ && MPI_Finalize() != MPI_SUCCESS) log().warn("mpi bootstrap: MPI_Finalize failed");
}

std::vector<Bytes> MpiBootstrap::allgather(const Bytes& mine, std::chrono::milliseconds /*timeout*/) {
  const auto n = static_cast<std::size_t>(size());
  const auto my_size = static_cast<std::int64_t>(mine.size());
  std::vector<std::int64_t> sizes(n);
  check_mpi(MPI_Allgather(&my_size, 1, MPI_INT64_T, sizes.data(), 1, MPI_INT64_T, comm_), "MPI_Allgather");
  // Every rank sees the same sizes, so every rank throws alike.
  const std::int64_t total = std::accumulate(sizes.begin(), sizes.end(), std::int64_t{0});
  if (total > INT_MAX) {
    throw_error(Errc::kInvalidArgument,
                fmt::format("mpi bootstrap allgather: {} bytes in all is over MPI's limit of {}", total, INT_MAX));
  }
  std::vector<int> counts(n);
  std::vector<int> offsets(n);
  for (std::size_t r = 0, offset = 0; r < n; offset += static_cast<std::size_t>(sizes[r]), ++r) {
    counts[r] = static_cast<int>(sizes[r]);
    offsets[r] = static_cast<int>(offset);
  }
  Bytes all(static_cast<std::size_t>(total) + 1);  // never empty: data() is a valid buffer even for 0 bytes
  static const std::uint8_t kNothing = 0;
  check_mpi(MPI_Allgatherv(mine.empty() ? &kNothing : mine.data(), counts[static_cast<std::size_t>(rank())], MPI_BYTE,
                           all.data(), counts.data(), offsets.data(), MPI_BYTE, comm_),
            "MPI_Allgatherv");
  std::vector<Bytes> out(n);
  for (std::size_t r = 0; r < n; ++r) {
    out[r].assign(all.begin() + offsets[r], all.begin() + offsets[r] + counts[r]);
  }
  return out;
}

void MpiBootstrap::barrier(std::chrono::milliseconds /*timeout*/) { check_mpi(MPI_Barrier(comm_), "MPI_Barrier"); }

}  // namespace dlop::transport
