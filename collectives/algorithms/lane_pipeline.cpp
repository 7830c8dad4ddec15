#include "lane_pipeline.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>

#include "core/error.hpp"

namespace dlop::coll {

void LanePipelineTask::configure(std::size_t columns, int steps, std::size_t window, std::size_t scratch_per_lane) {
  if (window == 0 || window > kMaxStep + 1) {
    throw_error(Errc::kInvalidArgument, fmt::format("pipeline window {} outside [1, {}]", window, kMaxStep + 1));
  }
  columns_ = steps > 0 ? columns : 0;
  steps_ = steps;
  lanes_.resize(std::min(window, std::max<std::size_t>(columns_, 1)));
  if (columns_ > 0 && scratch_per_lane > 0) {
    constexpr std::size_t kAlign = 64;
    scratch_stride_ = (scratch_per_lane + kAlign - 1) / kAlign * kAlign;
    scratch_ = std::make_unique_for_overwrite<std::byte[]>(lanes_.size() * scratch_stride_ + kAlign - 1);
    const auto address = reinterpret_cast<std::uintptr_t>(scratch_.get());
    scratch_base_ = scratch_.get() + ((kAlign - address % kAlign) % kAlign);
  }
}

bool LanePipelineTask::progress() {
  if (done_) return true;
  if (!begun_) {
    begun_ = true;
    begin();
  }
  for (bool moved = true; moved;) {
    moved = false;
    // Start columns in order, each once the previous user of its lane is done.
    while (next_column_ < columns_ && !lanes_[next_column_ % lanes_.size()].busy) {
      Lane& lane = lanes_[next_column_ % lanes_.size()];
      lane.busy = true;
      lane.posted = false;
      lane.column = next_column_++;
      lane.step = 0;
      moved = true;
    }
    for (std::size_t i = 0; i < lanes_.size(); ++i) {
      if (lanes_[i].busy && advance(lanes_[i], i)) moved = true;
    }
  }
  if (finished_columns_ < columns_) return false;
  end();
  done_ = true;
  return true;
}

bool LanePipelineTask::advance(Lane& lane, std::size_t index) {
  bool changed = false;
  while (lane.busy) {
    if (lane.posted) {
      const bool received = lane.recv.test();
      const bool sent = lane.send.test();
      if (!received || !sent) return changed;
      if (lane.receiving && lane.recv.received_bytes() != lane.expected) {
        throw_error(Errc::kProtocol,
                    fmt::format("step {} of column {}: expected {} B from the peer, got {} B", lane.step, lane.column,
                                lane.expected, lane.recv.received_bytes()));
      }
      lane.recv = transport::Request();
      lane.send = transport::Request();
      lane.posted = false;
      finish(lane.column, lane.step, index);
      changed = true;
      if (++lane.step == steps_) {
        lane.busy = false;
        ++finished_columns_;
        return true;
      }
    }
    post(lane, index);
    changed = true;
  }
  return changed;
}

void LanePipelineTask::post(Lane& lane, std::size_t index) {
  const StepIo io = plan(lane.column, lane.step, index);
  const transport::Tag tag = base_tag_ + index;
  lane.receiving = io.recv_from >= 0 && io.recv_bytes > 0;
  lane.expected = io.recv_bytes;
  if (lane.receiving) lane.recv = group_.recv(io.recv_from, io.recv_data, io.recv_bytes, tag);
  if (io.send_to >= 0 && io.send_bytes > 0) lane.send = group_.send(io.send_to, io.send_data, io.send_bytes, tag);
  lane.posted = true;
}

}  // namespace dlop::coll
