#include "device/runtime/step_layout.h"

#include <algorithm>
#include <map>

#include "model/error.h"

namespace parity::device {

int64_t pack_scores(int n_heads, std::span<const int32_t> positions,
                    std::vector<int64_t>& offsets) {
  offsets.resize(positions.size());
  int64_t at = 0;
  for (size_t r = 0; r < positions.size(); ++r) {
    offsets[r] = at;
    at += int64_t(n_heads) * (int64_t(positions[r]) + 2);
  }
  return at;
}

std::vector<int32_t> query_tiles(std::span<const StepRow> rows) {
  std::vector<int32_t> first;
  for (size_t r = 0; r < rows.size(); ++r)
    if (r == 0 || rows[r].seq != rows[r - 1].seq || int(r) - first.back() == kQueryTileRows)
      first.push_back(int32_t(r));
  first.push_back(int32_t(rows.size()));
  return first;
}

StepLayout build_step(const Batch& b, const Config& c, const KvBlockManager& kv) {
  StepLayout s;
  std::vector<int64_t> offsets;
  s.scores_floats = pack_scores(c.num_attention_heads, b.positions, offsets);
  std::map<int, std::array<int32_t, kKvGroups>> tables_of;  // sequence -> its tables' offsets
  s.rows.resize(size_t(b.rows()));
  for (int r = 0; r < b.rows(); ++r) {
    const int seq = b.seqs[size_t(r)];
    auto it = tables_of.find(seq);
    if (it == tables_of.end()) {
      std::array<int32_t, kKvGroups> at{};
      for (int g = 0; g < kKvGroups; ++g) {
        if (!kv.layout().has_group(g)) continue;
        const auto table = kv.table(seq, g);
        PARITY_CHECK(table.size() >= size_t(kv.layout().blocks_for(b.positions[size_t(r)] + 1)),
                     "step: sequence {} has no KV blocks for position {} (begin_step first)", seq,
                     b.positions[size_t(r)]);
        at[size_t(g)] = int32_t(s.block_tables.size());
        s.block_tables.insert(s.block_tables.end(), table.begin(), table.end());
      }
      it = tables_of.emplace(seq, at).first;
    }
    StepRow& row = s.rows[size_t(r)];
    row.token = b.tokens[size_t(r)];
    row.pos = b.positions[size_t(r)];
    row.seq = seq;
    row.kv_table[0] = it->second[0];
    row.kv_table[1] = it->second[1];
    row.scores_offset = offsets[size_t(r)];
    s.max_pos = std::max(s.max_pos, row.pos);
  }
  s.query_tiles = query_tiles(s.rows);
  return s;
}

}  // namespace parity::device
