#include "ring.hpp"

#include <algorithm>
#include <memory>
#include <utility>

#include "blocks.hpp"
#include "collectives/reduce.hpp"
#include "lane_pipeline.hpp"

namespace dlop::coll {
namespace {

class RingTask final : public LanePipelineTask {
 public:
  RingTask(const Group& group, transport::Tag base_tag, RingSpec spec)
      : LanePipelineTask(group, base_tag),
        spec_(std::move(spec)),
        n_(group.size()),
        me_(group.rank()),
        esize_(dtype_size(spec_.dtype)),
        chunk_(chunk_elements(kRingChunkBytes, esize_)),
        rs_steps_(spec_.reduce_scatter ? n_ - 1 : 0) {
    std::size_t largest = 0;
    for (const std::size_t c : spec_.counts) largest = std::max(largest, c);
    const std::size_t columns = chunks_in(largest, chunk_);
    const int steps = rs_steps_ + (spec_.all_gather ? n_ - 1 : 0);
    // Reduce-scatter: two chunks per lane, each rounded up to a cache line.
    slot_bytes_ = rs_steps_ > 0 ? (std::min(chunk_, largest) * esize_ + 63) / 64 * 64 : 0;
    configure(columns, steps, kRingWindow, 2 * slot_bytes_);
  }

 private:
  void begin() override {
    const auto me = static_cast<std::size_t>(me_);
    if (spec_.reduce_scatter && n_ == 1) {
      move_bytes(out(me, 0), in(me, 0), spec_.counts[me] * esize_);
    } else if (!spec_.reduce_scatter) {
      // All-gather alone: this rank's block goes into place (unless it is there).
      if (spec_.send != spec_.recv) move_bytes(out(me, 0), spec_.send, spec_.counts[me] * esize_);
    }
  }

  StepIo plan(std::size_t column, int step, std::size_t lane) override {
    const int right = ring_index(me_ + 1, n_);
    const int left = ring_index(me_ - 1, n_);
    if (step < rs_steps_) {
      const auto to = block(me_ - 1 - step);
      const auto from = block(me_ - 2 - step);
      const void* data = step == 0 ? in(to, column) : slot(lane, step - 1);
      return {right, data, piece(to, column).count * esize_,
              left,  slot(lane, step), piece(from, column).count * esize_};
    }
    const int t = step - rs_steps_;
    const auto to = block(me_ - t);
    const auto from = block(me_ - t - 1);
    return {right, out(to, column), piece(to, column).count * esize_,
            left,  out(from, column), piece(from, column).count * esize_};
  }

  void finish(std::size_t column, int step, std::size_t lane) override {
    if (step >= rs_steps_) return;
    const auto b = block(me_ - 2 - step);
    const std::size_t count = piece(b, column).count;
    if (step < rs_steps_ - 1) {
      reduce_into(spec_.op, spec_.dtype, slot(lane, step), in(b, column), slot(lane, step), count);
    } else {  // b is this rank's block: the result
      reduce_into(spec_.op, spec_.dtype, out(b, column), in(b, column), slot(lane, step), count);
      finalize(spec_.op, spec_.dtype, out(b, column), count, n_);
    }
  }

  std::size_t block(int b) const { return static_cast<std::size_t>(ring_index(b, n_)); }
  Span piece(std::size_t b, std::size_t column) const { return chunk_of(spec_.counts[b], chunk_, column); }
  const std::byte* in(std::size_t b, std::size_t column) const {
    return element_at(spec_.send, spec_.in_offset[b] + piece(b, column).offset, esize_);
  }
  std::byte* out(std::size_t b, std::size_t column) const {
    return element_at(spec_.recv, spec_.out_offset[b] + piece(b, column).offset, esize_);
  }
  std::byte* slot(std::size_t lane, int step) const {
    return scratch(lane) + static_cast<std::size_t>(step % 2) * slot_bytes_;
  }

  RingSpec spec_;
  int n_;
  int me_;
  std::size_t esize_;
  std::size_t chunk_;  // elements
  int rs_steps_;
  std::size_t slot_bytes_ = 0;
};

}  // namespace

std::unique_ptr<Task> make_ring_task(const Group& group, transport::Tag base_tag, RingSpec spec) {
  return std::make_unique<RingTask>(group, base_tag, std::move(spec));
}

}  // namespace dlop::coll
