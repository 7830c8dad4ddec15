// The ranks one collective runs among, as its algorithm sees them: group
// ranks 0..size-1 mapped onto the ranks of a transport::Mesh, and which host
// each one is on.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "transport/bootstrap.hpp"
#include "transport/mesh.hpp"

namespace dlop::coll {

// Shared memory of one group's ranks on this host, for the intra-host
// algorithms (collectives/algorithms/allreduce_shm_arena.hpp).
class HostArena;

class Group {
 public:
  // members[g] is the mesh rank of group rank g; this process must be one of them.
  Group(transport::Mesh& mesh, std::vector<int> members);

  int rank() const { return rank_; }
  int size() const { return static_cast<int>(members_.size()); }
  int mesh_rank(int group_rank) const { return members_.at(static_cast<std::size_t>(group_rank)); }
  transport::Mesh& mesh() const { return *mesh_; }

  // Hosts, numbered in order of first appearance among the group ranks.
  int hosts() const { return hosts_; }
  int host_of(int group_rank) const { return host_of_.at(static_cast<std::size_t>(group_rank)); }
  // Group ranks on this rank's host, ascending.
  const std::vector<int>& local_ranks() const { return local_ranks_; }

  // The intra-host shared memory, or null (not set up, or alone on the host).
  HostArena* host_arena() const { return arena_.get(); }
  void set_host_arena(std::shared_ptr<HostArena> arena) { arena_ = std::move(arena); }

  transport::Request send(int to, const void* data, std::size_t bytes, transport::Tag tag) const {
    return mesh_->send(mesh_rank(to), data, bytes, tag);
  }
  transport::Request recv(int from, void* data, std::size_t bytes, transport::Tag tag) const {
    return mesh_->recv(mesh_rank(from), data, bytes, tag);
  }

 private:
  transport::Mesh* mesh_;
  std::vector<int> members_;
  int rank_ = -1;
  int hosts_ = 0;
  std::vector<int> host_of_;
  std::vector<int> local_ranks_;
  std::shared_ptr<HostArena> arena_;
};

// Collective over this group's ranks on this host (each calls it with the
// same name, unique on the host and in the bootstrap's store; bootstrap ranks
// are mesh ranks): maps one shared segment among them and attaches it to the
// group. Does nothing when this rank is alone on its host. Throws what
// transport::ShmSegment::create_shared throws.
void attach_host_arena(Group& group, transport::Bootstrap& bootstrap, const std::string& name,
                       std::chrono::milliseconds timeout);

}  // namespace dlop::coll
