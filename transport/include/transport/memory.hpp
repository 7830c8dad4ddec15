// Registered memory for one-sided puts: the target registers a region and
// publishes its packed key; the source unpacks it for that peer's endpoint.
#pragma once

#include <ucp/api/ucp.h>

#include <cstddef>
#include <cstdint>

#include "transport/store.hpp"

namespace dlop::transport {

class UcxWorker;

class MemoryRegion {
 public:
  // Registers caller-owned memory (it must outlive the region).
  MemoryRegion(UcxWorker& worker, void* address, std::size_t bytes);
  // Allocates and registers `bytes` of memory owned by the region.
  MemoryRegion(UcxWorker& worker, std::size_t bytes);
  MemoryRegion(MemoryRegion&& other) noexcept;
  MemoryRegion& operator=(MemoryRegion&&) = delete;
  MemoryRegion(const MemoryRegion&) = delete;
  MemoryRegion& operator=(const MemoryRegion&) = delete;
  ~MemoryRegion();

  void* data() const { return address_; }
  std::size_t size() const { return bytes_; }
  std::uint64_t remote_address() const { return reinterpret_cast<std::uintptr_t>(address_); }
  // The key a peer needs to put into this region.
  Bytes pack_key() const;

 private:
  ucp_context_h context_ = nullptr;
  ucp_mem_h memh_ = nullptr;
  void* address_ = nullptr;
  std::size_t bytes_ = 0;
};

// A peer's memory key, unpacked for our endpoint to that peer (Mesh::unpack_key).
class RemoteKey {
 public:
  RemoteKey() = default;
  RemoteKey(int peer, ucp_rkey_h key) : peer_(peer), key_(key) {}
  RemoteKey(RemoteKey&& other) noexcept;
  RemoteKey& operator=(RemoteKey&& other) noexcept;
  RemoteKey(const RemoteKey&) = delete;
  RemoteKey& operator=(const RemoteKey&) = delete;
  ~RemoteKey();

  int peer() const { return peer_; }
  ucp_rkey_h get() const { return key_; }

 private:
  int peer_ = -1;
  ucp_rkey_h key_ = nullptr;
};

}  // namespace dlop::transport
