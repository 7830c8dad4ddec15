// Bootstrap: what a group of processes needs to find each other. rank/size,
// a shared store, and two collectives built on it. Implementations differ in
// where the store lives (a file system, our TCP store, a c10d Store) and may
// override the collectives with faster ones (MPI).
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "transport/store.hpp"

namespace dlop::transport {

class Bootstrap {
 public:
  // Keys are namespaced by prefix so that several groups can share one store.
  // A store that outlives an attempt of the job (torchrun's) needs a prefix
  // of that attempt's own: agree_session (session.hpp) makes one.
  Bootstrap(std::shared_ptr<Store> store, int rank, int size, std::string prefix = "dlop");
  virtual ~Bootstrap() = default;
  Bootstrap(const Bootstrap&) = delete;
  Bootstrap& operator=(const Bootstrap&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }

  void set(const std::string& key, const Bytes& value);
  Bytes get(const std::string& key, std::chrono::milliseconds timeout);

  // Every rank contributes one value; returns all of them, indexed by rank.
  // The timeout error names the ranks that did not contribute.
  virtual std::vector<Bytes> allgather(const Bytes& mine, std::chrono::milliseconds timeout);
  virtual void barrier(std::chrono::milliseconds timeout);

 protected:
  Store& store() { return *store_; }

 private:
  std::string scoped(const std::string& key) const;

  std::shared_ptr<Store> store_;
  int rank_;
  int size_;
  std::string prefix_;
  std::uint64_t collective_round_ = 0;
};

}  // namespace dlop::transport
