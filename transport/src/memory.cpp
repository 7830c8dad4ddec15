#include "transport/memory.hpp"

#include "core/error.hpp"
#include "transport/ucx_worker.hpp"

namespace dlop::transport {
namespace {

ucp_mem_h map(ucp_context_h context, void* address, std::size_t bytes, bool allocate) {
  ucp_mem_map_params_t params{};
  params.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH | UCP_MEM_MAP_PARAM_FIELD_FLAGS;
  params.address = address;
  params.length = bytes;
  params.flags = allocate ? UCP_MEM_MAP_ALLOCATE : 0;
  ucp_mem_h memh = nullptr;
  check_ucs(ucp_mem_map(context, &params, &memh), "ucp_mem_map");
  return memh;
}

}  // namespace

MemoryRegion::MemoryRegion(UcxWorker& worker, void* address, std::size_t bytes)
    : context_(worker.context()), address_(address), bytes_(bytes) {
  if (address == nullptr || bytes == 0) throw_error(Errc::kInvalidArgument, "cannot register an empty region");
  memh_ = map(context_, address, bytes, false);
}

MemoryRegion::MemoryRegion(UcxWorker& worker, std::size_t bytes) : context_(worker.context()), bytes_(bytes) {
  if (bytes == 0) throw_error(Errc::kInvalidArgument, "cannot allocate an empty region");
  memh_ = map(context_, nullptr, bytes, true);
  ucp_mem_attr_t attr{};
  attr.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS;
  check_ucs(ucp_mem_query(memh_, &attr), "ucp_mem_query");
  address_ = attr.address;
}

MemoryRegion::MemoryRegion(MemoryRegion&& other) noexcept
    : context_(other.context_), memh_(other.memh_), address_(other.address_), bytes_(other.bytes_) {
  other.memh_ = nullptr;
}

MemoryRegion::~MemoryRegion() {
  if (memh_ != nullptr) ucp_mem_unmap(context_, memh_);
}

Bytes MemoryRegion::pack_key() const {
  void* buffer = nullptr;
  std::size_t length = 0;
  check_ucs(ucp_rkey_pack(context_, memh_, &buffer, &length), "ucp_rkey_pack");
  const auto* begin = static_cast<const std::uint8_t*>(buffer);
  Bytes key(begin, begin + length);
  ucp_rkey_buffer_release(buffer);
  return key;
}

RemoteKey::RemoteKey(RemoteKey&& other) noexcept : peer_(other.peer_), key_(other.key_) { other.key_ = nullptr; }

RemoteKey& RemoteKey::operator=(RemoteKey&& other) noexcept {
  if (this != &other) {
    if (key_ != nullptr) ucp_rkey_destroy(key_);
    peer_ = other.peer_;
    key_ = other.key_;
    other.key_ = nullptr;
  }
  return *this;
}

RemoteKey::~RemoteKey() {
  if (key_ != nullptr) ucp_rkey_destroy(key_);
}

}  // namespace dlop::transport
