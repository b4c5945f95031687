#include "device/runtime/step.h"

#include <algorithm>
#include <cstring>

#include "model/error.h"

namespace parity::device {

bool Step::upload(StepLayout layout, hipStream_t stream) {
  const size_t rows = layout.rows.size(), tables = layout.block_tables.size();
  // The pinned staging rows may still be in flight from the previous step's copy.
  uploaded_.synchronize();
  // At most one query tile per row, and the end.
  PARITY_CHECK(layout.query_tiles.size() <= rows + 1, "step: {} query tiles for {} rows",
               layout.query_tiles.size(), rows);
  const bool grow = rows > row_capacity_ || tables > table_capacity_;
  if (grow) {
    HIP_CHECK(hipStreamSynchronize(stream));  // the kernels of the last step may read dev_
    row_capacity_ = std::max(rows, 2 * row_capacity_);
    table_capacity_ = std::max<size_t>(tables, std::max<size_t>(64, 2 * table_capacity_));
    tables_offset_ = (row_capacity_ * sizeof(StepRow) + 255) / 256 * 256;
    tiles_offset_ = (tables_offset_ + table_capacity_ * sizeof(int32_t) + 255) / 256 * 256;
    const size_t bytes = tiles_offset_ + (row_capacity_ + 1) * sizeof(int32_t);
    dev_.allocate(bytes);
    pinned_.allocate(bytes);
  }
  char* staging = pinned_.as<char>();
  std::memcpy(staging, layout.rows.data(), rows * sizeof(StepRow));
  std::memcpy(staging + tables_offset_, layout.block_tables.data(), tables * sizeof(int32_t));
  std::memcpy(staging + tiles_offset_, layout.query_tiles.data(),
              layout.query_tiles.size() * sizeof(int32_t));
  // One copy: the rows, the tables, the query tiles (and the gaps up to their alignment).
  const size_t bytes = tiles_offset_ + layout.query_tiles.size() * sizeof(int32_t);
  HIP_CHECK(hipMemcpyAsync(dev_.as(), staging, bytes, hipMemcpyHostToDevice, stream));
  uploaded_.record(stream);
  single_tiles_ =
      layout.query_tiles.empty()
          ? 0
          : leading_single_tiles(layout.query_tiles.data(), int(layout.query_tiles.size()) - 1);
  host_ = std::move(layout);
  return grow;
}

}  // namespace parity::device
