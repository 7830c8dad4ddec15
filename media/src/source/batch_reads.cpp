// BatchReads (source.hpp): a batch's neighbouring samples read with one
// request per run of them.
#include <algorithm>
#include <functional>

#include "media/object_store.hpp"
#include "concrete_sources.hpp"

namespace dlop::media {

BatchReads::BatchReads(const Source& source, std::span<const std::uint64_t> indices) : source_(source) {
  struct Want {
    ByteRange range;
    std::uint64_t index;
  };
  std::vector<Want> wants;
  for (const std::uint64_t i : indices) {
    if (i >= source.size()) continue;  // the maker names it
    if (const auto r = source.byte_range(i)) wants.push_back({*r, i});
  }
  if (wants.size() < 2) return;
  std::sort(wants.begin(), wants.end(), [](const Want& a, const Want& b) {
    if (a.range.object != b.range.object) return std::less<const ObjectReader*>()(a.range.object, b.range.object);
    return a.range.offset != b.range.offset ? a.range.offset < b.range.offset : a.index < b.index;
  });
  std::uint64_t held_bytes = 0;
  for (std::size_t first = 0, last; first < wants.size(); first = last) {
    const ObjectReader* object = wants[first].range.object;
    const std::uint64_t start = wants[first].range.offset;
    std::uint64_t end = start + wants[first].range.size;
    for (last = first + 1; last < wants.size(); ++last) {
      const ByteRange& r = wants[last].range;
      const std::uint64_t grown = std::max(end, r.offset + r.size);
      if (r.object != object || r.offset > end + kMaxGap || grown - start > kMaxBytes) break;
      end = grown;
    }
    // One sample: read() reads it, in parallel with the others; past the
    // batch's budget, so are the rest.
    if (last - first < 2 || held_bytes + (end - start) > kMaxBytes) continue;
    held_bytes += end - start;
    std::vector<std::uint8_t>& run = runs_.emplace_back(static_cast<std::size_t>(end - start));
    object->read(start, run);
    ++requests_;
    for (std::size_t k = first; k < last; ++k) {
      held_.push_back({wants[k].index, runs_.size() - 1, wants[k].range.offset - start, wants[k].range.size});
    }
  }
  std::sort(held_.begin(), held_.end(), [](const Held& a, const Held& b) { return a.index < b.index; });
}

std::span<const std::uint8_t> BatchReads::read(std::size_t i, std::vector<std::uint8_t>& scratch) const {
  const auto it = std::lower_bound(held_.begin(), held_.end(), std::uint64_t{i},
                                   [](const Held& h, std::uint64_t index) { return h.index < index; });
  if (it == held_.end() || it->index != i) return source_.read(i, scratch);
  return {runs_[it->run].data() + it->offset, static_cast<std::size_t>(it->size)};
}

}  // namespace dlop::media
