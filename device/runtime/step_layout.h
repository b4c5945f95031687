// The rows of one forward step as the kernels read them, built on the host (no GPU toolkit
// needed): per row its token, position, sequence, the offset of its scores/att block, and where
// its sequence's block tables start in the step's table array. device/runtime/step.h uploads it.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "device/kernel_types.h"
#include "device/runtime/kv_blocks.h"
#include "model/backend.h"

namespace parity::device {

struct StepLayout {
  std::vector<StepRow> rows;
  // Each sequence of the step once, in order of its first row: its table of every layer group
  // that has layers (KvBlockManager::table), back to back. StepRow::kv_table indexes here.
  std::vector<int32_t> block_tables;
  // The attention kernels' query tiles (QueryTiles): the first row of each, then the row count.
  std::vector<int32_t> query_tiles;
  int max_pos = 0;            // the largest position of the step (DeviceRuntime::launch_max_pos)
  int64_t scores_floats = 0;  // packed [nH, pos + 2] blocks of every row
};

// Offsets of each row's [nH, pos + 2] block in the packed scores/att buffers; returns the total.
int64_t pack_scores(int n_heads, std::span<const int32_t> positions, std::vector<int64_t>& offsets);

// Query tiles of `rows`: runs of consecutive rows of one sequence, at most kQueryTileRows each;
// the first row of every tile, then rows.size().
std::vector<int32_t> query_tiles(std::span<const StepRow> rows);

// The step's rows, after kv.begin_step(b) made room for them (the tables are read from kv).
StepLayout build_step(const Batch& b, const Config& c, const KvBlockManager& kv);

}  // namespace parity::device
