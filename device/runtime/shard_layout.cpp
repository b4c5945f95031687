#include "device/runtime/shard_layout.h"

#include <fmt/format.h>

#include <bit>
#include <cmath>

#include "model/error.h"

namespace parity::device {

int64_t StageShard::size() const {
  int64_t n = 0;
  for (const ShardRange& r : ranges) n += r.size();
  return n;
}

namespace {

StageShard ranges_of(std::vector<ShardRange> ranges) {
  return {ShardKind::ranges, std::move(ranges)};
}

// The experts' stages: a slot's row of `width` elements, of which the rank holds the slots of
// its experts (by_expert) or the columns [lo, hi) of every slot (by_intermediate).
StageShard expert_shard(Stage stage, const Config& c, const ShardPlan& p,
                        std::span<const int32_t> topk_idx, int width, int lo, int hi) {
  const int k = c.num_experts_per_tok;
  PARITY_CHECK(int(topk_idx.size()) == k,
               "stage_shard: {} needs the row's {} expert choices, got {}", name(stage), k,
               topk_idx.size());
  std::vector<ShardRange> ranges;
  for (int j = 0; j < k; ++j) {
    if (p.experts_split == ExpertSplit::by_expert) {
      const int e = topk_idx[size_t(j)];
      if (e >= 0 && e < c.num_local_experts && p.rank_of_expert(e) == p.rank)
        ranges.push_back({j * width, (j + 1) * width});
    } else {
      ranges.push_back({j * width + lo, j * width + hi});
    }
  }
  return ranges_of(std::move(ranges));
}

bool same_bits(float a, float b) {
  return std::bit_cast<uint32_t>(a) == std::bit_cast<uint32_t>(b);
}

Gathered problem(int rank, std::string line) {
  Gathered g;
  g.problem = std::move(line);
  g.rank = rank;
  return g;
}

// The rank whose value at element i differs from the others' (with two ranks, the second), or -1.
int dissenting_rank(std::span<const RankRow> rows, int64_t i) {
  const int n = int(rows.size());
  for (int r = 0; r < n; ++r) {
    int agree = 0;
    for (int o = 0; o < n; ++o)
      agree += same_bits(rows[size_t(r)].row[size_t(i)], rows[size_t(o)].row[size_t(i)]);
    if (2 * agree <= n && (n > 2 || r > 0)) return r;
  }
  return -1;
}

}  // namespace

StageShard stage_shard(Stage stage, const Config& c, const ShardPlan& p,
                       std::span<const int32_t> topk_idx, int pos) {
  const int d = c.head_dim, I = c.intermediate_size;
  const bool by_expert = p.experts_split == ExpertSplit::by_expert;
  switch (stage) {
    case Stage::qkv:
      return ranges_of({p.q_rows, p.k_rows, p.v_rows});
    case Stage::q_rope:
    case Stage::attn_out:
      return ranges_of({{p.q_heads.begin * d, p.q_heads.end * d}});
    case Stage::k_rope:
    case Stage::v:
      return ranges_of({{p.kv_heads.begin * d, p.kv_heads.end * d}});
    case Stage::scores:
    case Stage::att: {
      const int cols = pos + 2;  // the keys 0 .. pos and the sink
      return ranges_of({{p.q_heads.begin * cols, p.q_heads.end * cols}});
    }
    case Stage::o_proj:
    case Stage::moe_out:
      return {ShardKind::reduced, {}};
    case Stage::logits:
      return ranges_of({p.vocab});
    case Stage::mlp1:
      return expert_shard(stage, c, p, topk_idx, 2 * I, 2 * p.intermediate.begin,
                          2 * p.intermediate.end);
    case Stage::swiglu:
      return expert_shard(stage, c, p, topk_idx, I, p.intermediate.begin, p.intermediate.end);
    case Stage::mlp2:
      if (!by_expert) return {ShardKind::partial, {}};
      return expert_shard(stage, c, p, topk_idx, c.hidden_size, 0, c.hidden_size);
    default:
      return {};
  }
}

Gathered gather_shards(Stage stage, std::span<const StageShard> layouts,
                       std::span<const RankRow> rows, int64_t full_size) {
  const std::string_view st = name(stage);
  PARITY_CHECK(!layouts.empty() && layouts.size() == rows.size() && full_size >= 0,
               "gather_shards({}): {} layouts for {} ranks' rows", st, layouts.size(), rows.size());
  const int n = int(rows.size());
  const ShardKind kind = layouts[0].kind;
  for (int r = 0; r < n; ++r)
    PARITY_CHECK(layouts[size_t(r)].kind == kind,
                 "gather_shards({}): rank {}'s layout is of another kind", st, r);
  // Every rank's row (and partial sum) of the size its layout says.
  for (int r = 0; r < n; ++r) {
    const RankRow& rr = rows[size_t(r)];
    const int64_t want = kind == ShardKind::ranges ? layouts[size_t(r)].size() : full_size;
    if (int64_t(rr.row.size()) != want)
      return problem(r, fmt::format("{}: rank {}'s row holds {} elements, its shard {}", st, r,
                                    rr.row.size(), want));
    if (kind == ShardKind::reduced && int64_t(rr.partial.size()) != full_size)
      return problem(r, fmt::format("{}: rank {}'s partial sum holds {} elements, the row {}", st,
                                    r, rr.partial.size(), full_size));
  }
  Gathered g;
  switch (kind) {
    case ShardKind::replicated:
      for (int64_t i = 0; i < full_size; ++i)
        for (int r = 1; r < n; ++r)
          if (!same_bits(rows[0].row[size_t(i)], rows[size_t(r)].row[size_t(i)])) {
            const int bad = dissenting_rank(rows, i), named = bad >= 0 ? bad : r;
            const int other = named == 0 ? 1 : 0;
            return problem(named, fmt::format("{}: rank {}'s element {} is {}, rank {}'s {}: the "
                                              "ranks' copies of a replicated stage differ",
                                              st, named, i, rows[size_t(named)].row[size_t(i)],
                                              other, rows[size_t(other)].row[size_t(i)]));
          }
      g.row.assign(rows[0].row.begin(), rows[0].row.end());
      return g;
    case ShardKind::ranges: {
      g.row.assign(size_t(full_size), 0.0f);
      std::vector<int> holder(size_t(full_size), -1);
      for (int r = 0; r < n; ++r) {
        int64_t at = 0;
        for (const ShardRange& range : layouts[size_t(r)].ranges) {
          for (int64_t i = range.begin; i < range.end; ++i, ++at) {
            if (i < 0 || i >= full_size)
              return problem(r, fmt::format("{}: rank {}'s shard holds element {}, outside the "
                                            "row of {}",
                                            st, r, i, full_size));
            if (holder[size_t(i)] >= 0)
              return problem(r, fmt::format("{}: element {} is in the shards of ranks {} and {}",
                                            st, i, holder[size_t(i)], r));
            holder[size_t(i)] = r;
            g.row[size_t(i)] = rows[size_t(r)].row[size_t(at)];
          }
        }
      }
      for (int64_t i = 0; i < full_size; ++i)
        if (holder[size_t(i)] < 0)
          return problem(-1, fmt::format("{}: no rank's shard holds element {}", st, i));
      return g;
    }
    case ShardKind::reduced:
      for (int64_t i = 0; i < full_size; ++i) {
        double sum = 0, magnitude = 0;
        for (int r = 0; r < n; ++r) {
          sum += double(rows[size_t(r)].partial[size_t(i)]);
          magnitude += std::fabs(double(rows[size_t(r)].partial[size_t(i)]));
        }
        const double bound = n * std::ldexp(magnitude, -23);
        for (int r = 0; r < n; ++r) {
          const double v = rows[size_t(r)].row[size_t(i)];
          const bool both_nan = std::isnan(v) && std::isnan(sum);
          if (!both_nan && v != sum && !(std::fabs(v - sum) <= bound))
            return problem(r, fmt::format("{}: rank {}'s all-reduced element {} is {}, the ranks' "
                                          "partial sums add to {:.9g} (all-reduce missing, "
                                          "doubled or short of a rank)",
                                          st, r, i, v, sum));
          if (!same_bits(rows[0].row[size_t(i)], rows[size_t(r)].row[size_t(i)]))
            return problem(
                r, fmt::format("{}: rank {}'s all-reduced element {} is {}, rank 0's {}: "
                               "the ranks' all-reduces differ in bits",
                               st, r, i, rows[size_t(r)].row[size_t(i)], rows[0].row[size_t(i)]));
        }
      }
      g.row.assign(rows[0].row.begin(), rows[0].row.end());
      return g;
    case ShardKind::partial:
      g.row.resize(size_t(full_size));
      for (int64_t i = 0; i < full_size; ++i) {
        double sum = 0;
        for (int r = 0; r < n; ++r) sum += double(rows[size_t(r)].row[size_t(i)]);
        g.row[size_t(i)] = float(sum);
      }
      return g;
  }
  return g;
}

int rank_holding(std::span<const StageShard> layouts, int64_t i) {
  for (size_t r = 0; r < layouts.size(); ++r) {
    if (layouts[r].kind != ShardKind::ranges) return -1;
    for (const ShardRange& range : layouts[r].ranges)
      if (i >= range.begin && i < range.end) return int(r);
  }
  return -1;
}

}  // namespace parity::device
