// Bootstrap for jobs started by mpirun (dlop-bench, tools): rank and size come
// from MPI_COMM_WORLD, allgather and barrier are MPI's own, and the key/value
// store is a TcpStoreServer on rank 0 that every rank connects to.
#pragma once

// Only MPI's C API: the C++ bindings (deprecated) would need libmpi_cxx.
#include <mpi.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "core/config.hpp"
#include "transport/bootstrap.hpp"
#include "transport/tcp_store.hpp"

namespace dlop::transport {

// Throws dlop::Error(kTransport) naming `what` (the MPI call) and MPI's own
// text for `rc`, unless rc is MPI_SUCCESS. Meant for communicators whose
// error handler is MPI_ERRORS_RETURN.
void check_mpi(int rc, const char* what);

class MpiBootstrap : public Bootstrap {
 public:
  // Collective over MPI_COMM_WORLD. Initialises MPI (MPI_THREAD_SERIALIZED)
  // when it is not yet initialised, and then finalises it on destruction;
  // an MPI initialised by the caller is left initialised. Rank 0 serves the
  // store on every interface and advertises gethostname() (127.0.0.1 when
  // the name does not resolve); every rank connects within connect_timeout
  // or throws dlop::Error(kTimeout). After a failure MPI is left initialised.
  explicit MpiBootstrap(std::chrono::milliseconds connect_timeout = config().timeout,
                        std::string prefix = "dlop");
  // Collective too: waits at a barrier so that rank 0 stops serving the store
  // only once no rank uses it.
  ~MpiBootstrap() override;

  // MPI's collectives cannot time out: the timeout is accepted for the
  // interface and ignored; a dead rank is MPI's to report (usually by
  // aborting the job). Errors returned by MPI throw dlop::Error(kTransport).
  // allgather needs every contribution, and their sum, under 2 GiB
  // (kInvalidArgument on every rank otherwise).
  std::vector<Bytes> allgather(const Bytes& mine, std::chrono::milliseconds timeout) override;
  void barrier(std::chrono::milliseconds timeout) override;

  // A duplicate of MPI_COMM_WORLD, owned by this bootstrap.
  MPI_Comm comm() const { return comm_; }
  // "host:port" of the store every rank is connected to.
  const std::string& store_address() const { return address_; }

 private:
  struct Setup;
  explicit MpiBootstrap(Setup setup, std::string prefix);

  bool finalize_ = false;
  MPI_Comm comm_ = MPI_COMM_NULL;
  std::unique_ptr<TcpStoreServer> server_;  // rank 0 only
  std::string address_;
};

}  // namespace dlop::transport
