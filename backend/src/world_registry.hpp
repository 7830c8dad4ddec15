// What the process groups of one process share: one engine (the default
// group's, which sub-groups join through Communicator::subgroup), one
// completion thread and one fault channel.
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "scheduler/communicator.hpp"

namespace dlop::backend {

class CompletionQueue;

// The communicator for a new group. global_ranks empty: the default group,
// which starts the process's engine. Otherwise the group's ranks in the
// default group: a sub-communicator of the live default group's engine, or
// (no live default group of dlop) an engine of its own.
// The engine keeps a reference to the bootstrap it was created with: a group
// holds engine_bootstrap for as long as it holds the communicator.
struct GroupCommunicator {
  std::shared_ptr<sched::Communicator> comm;
  std::shared_ptr<transport::Bootstrap> engine_bootstrap;
};
GroupCommunicator make_group_communicator(const std::shared_ptr<transport::Bootstrap>& bootstrap,
                                          const std::vector<int>& global_ranks,
                                          sched::Communicator::Options options);

// The process's completion thread, started with the first group and joined
// when the last one lets go of it.
std::shared_ptr<CompletionQueue> shared_completion_queue();

// A peer's death, seen by one rank, made known to every rank of the job.
//
// A rank learns that a peer died only from its own traffic with it (or, on
// one host, from the liveness watchdog). On several hosts a rank waiting on a
// live peer that has itself just failed because of the death would sit out
// the whole timeout and then name the live peer. So the first rank whose
// operation fails with a dead peer writes the message to the default group's
// store, and every rank polls that key and aborts its groups with it: their
// pending and later operations fail at once, naming the dead rank.
class FaultChannel {
 public:
  struct State;
  // Polls `store` (the default group's) from a thread this channel owns, over
  // a connection of its own (store->clone()) where the store can make one.
  // Reports go to `key`, under this attempt's namespace of the store: a
  // report of an earlier attempt must not abort this one.
  FaultChannel(c10::intrusive_ptr<c10d::Store> store, int rank, std::string key);
  // Stops the poller and joins it. A poll in flight finishes first: a round
  // trip to the store, or an error at once if the store's host rank exited;
  // a store whose host vanished from the network holds it for up to the
  // store's timeout.
  ~FaultChannel();
  FaultChannel(const FaultChannel&) = delete;
  FaultChannel& operator=(const FaultChannel&) = delete;

  // From any thread; the first report of this process only.
  void report(const std::string& what);
  // Aborted when a report (this rank's or another's) arrives.
  void watch(const std::shared_ptr<sched::Communicator>& comm);
  // Stops and joins the poller (idempotent); the destructor and exit() call it.
  void stop();

 private:
  std::shared_ptr<State> state_;
  std::thread poller_;  // joined by stop()
  std::mutex stop_mutex_;  // one joiner at a time
};

// The live default group's channel; null when there is none. default_store:
// for the default group itself (makes the channel, reporting under key), else
// null.
std::shared_ptr<FaultChannel> group_fault_channel(const c10::intrusive_ptr<c10d::Store>& default_store, int rank,
                                                  const std::string& key);

}  // namespace dlop::backend
