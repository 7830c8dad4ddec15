#include "collectives/group.hpp"

#include <algorithm>
#include <fmt/format.h>
#include <map>

#include "core/error.hpp"

namespace dlop::coll {

Group::Group(transport::Mesh& mesh, std::vector<int> members) : mesh_(&mesh), members_(std::move(members)) {
  std::map<std::string, int> host_numbers;
  for (std::size_t g = 0; g < members_.size(); ++g) {
    const int m = members_[g];
    if (m < 0 || m >= mesh.size()) {
      throw_error(Errc::kInvalidArgument, fmt::format("group member {} is outside the mesh of {}", m, mesh.size()));
    }
    if (m == mesh.rank()) rank_ = static_cast<int>(g);
    const auto [it, inserted] = host_numbers.try_emplace(mesh.host_of(m), hosts_);
    if (inserted) ++hosts_;
    host_of_.push_back(it->second);
  }
  if (rank_ < 0) throw_error(Errc::kInvalidArgument, "this process is not a member of the group");
  for (int g = 0; g < size(); ++g) {
    if (host_of(g) == host_of(rank_)) local_ranks_.push_back(g);
  }
}

}  // namespace dlop::coll
