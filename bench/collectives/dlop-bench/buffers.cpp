#include "buffers.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "core/error.hpp"

namespace dlop::bench {
namespace {

constexpr std::size_t kAlign = 256;  // slot parts start a few cache lines apart
constexpr std::size_t kPage = 4096;

std::size_t align_up(std::size_t v, std::size_t a) { return (v + a - 1) / a * a; }

}  // namespace

Arena::Arena(std::size_t bytes) : bytes_(align_up(std::max(bytes, kPage), kPage)) {
  data_ = static_cast<std::byte*>(std::aligned_alloc(kPage, bytes_));
  if (data_ == nullptr) throw_error(Errc::kSystem, fmt::format("cannot allocate {} B of buffers", bytes_));
  std::memset(data_, 0, bytes_);  // every page resident before timing (and counted in the RSS)
}

Arena::~Arena() { std::free(data_); }

SlotPlan plan_slots(const CollLayout& l, coll::DataType dtype, std::size_t rotate_bytes) {
  const std::size_t elt = coll::dtype_size(dtype);
  SlotPlan p;
  p.send_bytes = align_up(l.in_elems * elt, kAlign);
  p.slot_bytes = p.send_bytes + align_up(std::max(l.in_elems, l.out_elems) * elt, kAlign);
  if (p.slot_bytes > 0 && l.bytes <= rotate_bytes) p.slots = std::max<std::size_t>(1, kRotateSpan / p.slot_bytes);
  return p;
}

Call slot_call(const Arena& arena, const SlotPlan& p, std::size_t slot, const CollLayout& l, Call c, int rank) {
  std::byte* base = arena.at((slot % p.slots) * p.slot_bytes);
  c.kind = l.kind;
  c.count = l.count;
  c.recv = base + p.send_bytes;
  c.send = base;
  if (c.in_place || l.kind == coll::CollKind::kBroadcast) {
    const std::size_t own = l.kind == coll::CollKind::kAllgather ? static_cast<std::size_t>(rank) * l.count : 0;
    c.send = static_cast<std::byte*>(c.recv) + own * coll::dtype_size(c.dtype);
  }
  return c;
}

}  // namespace dlop::bench
