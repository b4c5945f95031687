// How a tensor-parallel group's row of a stage was put together from its ranks' rows
// (device/runtime/shard_layout.h gathers them): the kind of the stage's split, the group's size,
// which elements each rank alone computed, and what the gathering found wrong. A candidate row
// carries it (StageData::shards), a trace keeps it as the dataset's "shards" attributes, and the
// differ names the rank behind a divergence from it.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace parity {

struct RowShards {
  // "replicated" (every rank computes the whole row), "ranges" (each rank some elements),
  // "reduced" (the all-reduce of the ranks' partial sums), "partial" (their sum, gathered by the
  // tracer).
  std::string kind;
  int ranks = 0;
  struct Range {
    int rank = 0;
    int64_t begin = 0, end = 0;  // [begin, end) of the row's elements
    friend bool operator==(const Range&, const Range&) = default;
  };
  std::vector<Range> ranges;  // kind ranges: which rank computed which elements
  // What gathering the ranks' rows found (their copies of a replicated stage differ, an
  // all-reduced row is not the sum of the partial sums), one line; "" when nothing. The rank it
  // names, or -1.
  std::string problem;
  int problem_rank = -1;

  // The rank whose range holds `element`, or -1.
  int rank_of(int64_t element) const;
  // "ranges 2 0:0-64 1:64-128": the kind, the ranks, then rank:begin-end per range.
  std::string text() const;
  // The text back, checked against a row of `elements` elements: a known kind, 1 to kMaxRanks
  // ranks, ranges inside the row, of ranks in the group, not overlapping. nullopt with `why` set
  // when it is not such a text.
  static std::optional<RowShards> parse(std::string_view text, int64_t elements, std::string& why);

  static constexpr int kMaxRanks = 1024;
  friend bool operator==(const RowShards&, const RowShards&) = default;
};

}  // namespace parity
