// The current step on the device: its rows (StepRow) and its sequences' block tables, built on
// the host (build_step) and uploaded once per step, in one copy from pinned memory on the
// runtime's stream. The kernels of the step read them; nothing else of the step is uploaded.
#pragma once
#include <cstddef>

#include "device/hip_compat.h"
#include "device/runtime/device_buffer.h"
#include "device/runtime/step_layout.h"
#include "device/runtime/stream.h"

namespace parity::device {

class Step {
 public:
  // Copies `layout` to the device on `stream` (asynchronously; the pinned staging copy is kept
  // until the copy is done). Grows the buffers first when the step is larger than any before,
  // waiting for `stream`; returns whether they moved.
  bool upload(StepLayout layout, hipStream_t stream);

  const StepLayout& host() const { return host_; }  // the rows as uploaded
  int rows() const { return int(host_.rows.size()); }
  int max_pos() const { return host_.max_pos; }
  const StepRow* device_rows() const { return dev_.as<const StepRow>(); }
  const int32_t* device_block_tables() const { return dev_.as<const int32_t>(tables_offset_); }
  // The attention kernels' query tiles (host().query_tiles, on the device).
  QueryTiles device_query_tiles() const {
    return {dev_.as<const int32_t>(tiles_offset_), int(host_.query_tiles.size()) - 1,
            single_tiles_};
  }

 private:
  StepLayout host_;
  size_t row_capacity_ = 0, table_capacity_ = 0, tables_offset_ = 0, tiles_offset_ = 0;
  int single_tiles_ = 0;  // QueryTiles::singles of host_.query_tiles
  DeviceBuffer dev_;     // [rows][tables][query tiles], as pinned_
  PinnedBuffer pinned_;  // staging for the one copy
  Event uploaded_;       // the last copy out of pinned_
};

}  // namespace parity::device
