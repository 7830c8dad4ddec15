// Mesh set-up (the wire-up of addresses over the bootstrap) and the watchdog
// over local peers.
#include <algorithm>
#include <cstring>

#include "core/error.hpp"
#include "core/log.hpp"
#include "mesh_peer.hpp"

namespace dlop::transport {
namespace {

using Clock = std::chrono::steady_clock;

// What each rank publishes about itself during wire-up.
struct WireHeader {
  std::uint32_t magic;
  std::int32_t pid;
  std::uint64_t start_time;
  std::uint32_t host_bytes;
  std::uint32_t address_bytes;
};
constexpr std::uint32_t kWireMagic = 0x444c4d31;  // "DLM1"

Bytes encode_self(const Bytes& address, const std::string& host) {
  const ProcessId self = ProcessId::self();
  const WireHeader header{kWireMagic, self.pid, self.start_time, static_cast<std::uint32_t>(host.size()),
                          static_cast<std::uint32_t>(address.size())};
  Bytes bytes(sizeof(header) + host.size() + address.size());
  std::memcpy(bytes.data(), &header, sizeof(header));
  std::memcpy(bytes.data() + sizeof(header), host.data(), host.size());
  std::memcpy(bytes.data() + sizeof(header) + host.size(), address.data(), address.size());
  return bytes;
}

Bytes decode_peer(const Bytes& bytes, int rank, ProcessId& process, std::string& host) {
  WireHeader header{};
  if (bytes.size() >= sizeof(header)) std::memcpy(&header, bytes.data(), sizeof(header));
  if (bytes.size() < sizeof(header) || header.magic != kWireMagic ||
      bytes.size() != sizeof(header) + header.host_bytes + header.address_bytes) {
    throw_error(Errc::kProtocol, fmt::format("mesh wire-up: malformed record from rank {}", rank));
  }
  process = ProcessId{header.pid, header.start_time};
  const auto* host_begin = reinterpret_cast<const char*>(bytes.data() + sizeof(header));
  host.assign(host_begin, header.host_bytes);
  const auto address_begin = bytes.begin() + static_cast<std::ptrdiff_t>(sizeof(header) + header.host_bytes);
  return Bytes(address_begin, bytes.end());
}

}  // namespace

Mesh::Mesh(UcxWorker& worker, Bootstrap& bootstrap) : Mesh(worker, bootstrap, Options{}) {}

Mesh::Mesh(UcxWorker& worker, Bootstrap& bootstrap, const Options& options)
    : worker_(worker),
      options_(options),
      rank_(bootstrap.rank()),
      peers_(static_cast<std::size_t>(bootstrap.size())),
      endpoints_(worker, Endpoints::Options{options.timeout, options.progress, options.spin}) {
  if (bootstrap.size() > (1 << (64 - kRankShift))) {
    throw_error(Errc::kInvalidArgument, fmt::format("mesh of {} ranks exceeds the tag layout", bootstrap.size()));
  }
  endpoints_.set_any_name("any rank");
  connect(bootstrap.allgather(encode_self(worker_.address(), options_.host), options_.timeout));
  endpoints_.set_liveness_check([this] { check_peers(); }, options_.watchdog);
}

Mesh::~Mesh() = default;  // endpoints_ closes

void Mesh::connect(const std::vector<Bytes>& records) {
  for (int rank = 0; rank < size(); ++rank) {
    Peer& peer = peers_[static_cast<std::size_t>(rank)];
    const Bytes address = decode_peer(records[static_cast<std::size_t>(rank)], rank, peer.process, peer.host);
    peer.local = peer.host == options_.host;
    const std::string name = fmt::format("rank {} (pid {} on {})", rank, peer.process.pid,
                                         peer.local ? std::string("this host") : "host " + peer.host);
    const int index = endpoints_.connect(address, peer.local, name);
    if (index != rank) throw_error(Errc::kTransport, "mesh endpoints out of rank order");
  }
}

int Mesh::check_peers() {
  int found = 0;
  bool drained = false;
  for (int rank = 0; rank < size(); ++rank) {
    const Peer& peer = peers_[static_cast<std::size_t>(rank)];
    if (peer.local && !peer_failure(rank) && rank != rank_ && !peer.process.alive()) {
      // Its last messages may still sit unread in shared memory (a peer that
      // finished and exited): deliver them before failing what is left.
      while (!drained && worker_.progress()) {
      }
      drained = true;
      endpoints_.mark_dead(rank, fmt::format("its process {} exited", peer.process.pid));
      ++found;
    }
  }
  return found;
}

int Mesh::event_fd() const { return worker_.event_fd(); }

bool Mesh::arm() { return worker_.arm(); }

}  // namespace dlop::transport
