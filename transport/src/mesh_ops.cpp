// Mesh operations: rank-addressed tagged send/recv and the fence.
#include "core/error.hpp"
#include "mesh_peer.hpp"

namespace dlop::transport {
namespace {

constexpr ucp_tag_t kFullMask = ~ucp_tag_t{0};
constexpr Tag kFenceTag = kMaxUserTag + 1;

void check_tag(Tag tag) {
  if (tag > kMaxUserTag) {
    throw_error(Errc::kInvalidArgument, fmt::format("tag {:#x} exceeds the {} bits a user tag may use", tag, kUserTagBits));
  }
}

ucp_tag_t from(int rank, Tag tag) { return (static_cast<ucp_tag_t>(rank) << kRankShift) | tag; }

}  // namespace

Request Mesh::send(int peer, const void* buffer, std::size_t bytes, Tag tag) {
  check_tag(tag);
  if (peer < 0 || peer >= size()) {
    throw_error(Errc::kInvalidArgument, fmt::format("rank {} is outside the mesh of {} ranks", peer, size()));
  }
  return endpoints_.send(peer, buffer, bytes, from(rank_, tag));
}

Request Mesh::recv(int peer, void* buffer, std::size_t bytes, Tag tag) {
  check_tag(tag);
  if (peer < 0 || peer >= size()) {
    throw_error(Errc::kInvalidArgument, fmt::format("rank {} is outside the mesh of {} ranks", peer, size()));
  }
  return endpoints_.recv(peer, buffer, bytes, from(peer, tag), kFullMask);
}

Request Mesh::recv_any(void* buffer, std::size_t bytes, Tag tag) {
  check_tag(tag);
  return endpoints_.recv(-1, buffer, bytes, tag, kUserTagMask);
}

void Mesh::fence(std::chrono::milliseconds timeout) {
  std::vector<Request> requests;
  for (int peer = 0; peer < size(); ++peer) {
    if (peer == rank_ || peer_failure(peer)) continue;
    requests.push_back(endpoints_.send(peer, nullptr, 0, from(rank_, kFenceTag)));
    requests.push_back(endpoints_.recv(peer, nullptr, 0, from(peer, kFenceTag), kFullMask));
  }
  for (auto& r : requests) r.wait(timeout);
}

}  // namespace dlop::transport
