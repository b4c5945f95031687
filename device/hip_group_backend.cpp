// The `hip` backend over a tensor-parallel group: device/hip_group_backend.h says what it does.
#include "device/hip_group_backend.h"

#include <fmt/format.h>

#include <algorithm>
#include <memory>
#include <span>
#include <vector>

#include "device/hip_backend.h"
#include "model/error.h"

namespace parity {
namespace device {
namespace {

std::string kind_name(ShardKind k) {
  switch (k) {
    case ShardKind::replicated:
      return "replicated";
    case ShardKind::ranges:
      return "ranges";
    case ShardKind::reduced:
      return "reduced";
    case ShardKind::partial:
      return "partial";
  }
  return "replicated";
}

bool is_reduced(Stage s) {
  return s == Stage::o_proj || s == Stage::moe_out;
}

}  // namespace

HipGroupBackend::HipGroupBackend(const Model& m, const DeviceOptions& o,
                                 std::span<const int> devices)
    : c_(m.config),
      group_(devices, o.tensor_parallel.all_reduce == AllReduce::peer),
      ranks_(devices.size()) {
  const int n = group_.size();
  group_.run([&](int r) {
    DeviceOptions ro = o;
    ro.device = devices[size_t(r)];
    ro.tensor_parallel.degree = n;
    ro.tensor_parallel.rank = r;
    ro.tensor_parallel.comm = group_.comm(r);
    ro.tensor_parallel.peers = group_.peers(r);
    if (r != 0) ro.log = nullptr;
    ranks_[size_t(r)] = std::make_unique<HipBackend>(m, ro);
  });
  for (const auto& rank : ranks_) plans_.push_back(*rank->runtime().shard());
}

HipGroupBackend::~HipGroupBackend() {
  try {  // each rank's runtime goes on its own thread, its device current
    group_.run([&](int r) { ranks_[size_t(r)].reset(); });
  } catch (const std::exception&) {  // a broken group: they go here
  }
  ranks_.clear();
}

std::string HipGroupBackend::precision() const {
  return ranks_[0]->precision() +
         fmt::format(
             "; tensor parallel over {} GPUs: each rank's partial sums of o_proj and "
             "the experts gathered ({}) and added in rank order in float32",
             ranks_.size(), group_.peers(0) != nullptr ? "by peer stores" : "by NCCL");
}

nlohmann::json HipGroupBackend::facts() const {
  nlohmann::json f = ranks_[0]->facts();
  f.erase("tensor_parallel_rank");
  nlohmann::json devices = nlohmann::json::array();
  for (const auto& rank : ranks_) devices.push_back(rank->runtime().device().index);
  f["devices"] = devices;
  return f;
}

void HipGroupBackend::with_rank(int r, const std::function<void(Backend&)>& fn) {
  PARITY_CHECK(r >= 0 && r < degree(), "with_rank({}) of a group of {}", r, degree());
  fetched_.reset();  // fn may change anything on the rank
  on_ranks([&](int rank) {
    if (rank == r) fn(*ranks_[size_t(r)]);
  });
}

StageData HipGroupBackend::read(Stage s, int layer, int row) {
  const int n = degree(), pos = position(row);
  std::vector<StageData> rows(ranks_.size());
  std::vector<std::optional<StageData>> parts(ranks_.size());
  fetched_.reset();
  on_ranks([&](int r) {
    rows[size_t(r)] = ranks_[size_t(r)]->read(s, layer, row);
    if (is_reduced(s)) parts[size_t(r)] = ranks_[size_t(r)]->own_partial(s, layer, row);
  });
  RowShards shards;
  shards.ranks = n;
  if (info(s).kind == ValueKind::Index) {  // replicated: the same choices on every rank
    shards.kind = "replicated";
    StageData d = rows[0];
    for (int r = 1; r < n; ++r)
      if (rows[size_t(r)].i32 != rows[0].i32) {
        shards.problem = fmt::format(
            "{}: rank {}'s choices differ from rank 0's: the ranks' "
            "copies of a replicated stage differ",
            parity::name(s), r);
        shards.problem_rank = r;
        d = rows[size_t(r)];
        break;
      }
    d.shards = std::move(shards);
    return d;
  }
  std::vector<StageShard> lay = layouts(s, layer, row);
  const bool logits = s == Stage::logits;
  const bool with_partials =
      lay[0].kind == ShardKind::reduced &&
      std::all_of(parts.begin(), parts.end(), [](const auto& p) { return p.has_value(); });
  // The logits are joined on every rank (checked as replicated, blamed by vocabulary rows); an
  // all-reduced row whose partial sums are gone is checked as replicated.
  if (logits || (lay[0].kind == ShardKind::reduced && !with_partials))
    for (StageShard& l : lay) l = StageShard{};
  std::vector<RankRow> rank_rows;
  for (int r = 0; r < n; ++r)
    rank_rows.push_back({rows[size_t(r)].f32, with_partials
                                                  ? std::span<const float>(parts[size_t(r)]->f32)
                                                  : std::span<const float>()});
  int64_t full = 1;
  for (size_t d : stage_dims(c_, s, pos)) full *= int64_t(d);
  Gathered g = gather_shards(s, lay, rank_rows, full);
  shards.kind = logits ? "ranges" : kind_name(lay[0].kind);
  for (int r = 0; r < n; ++r) {
    if (logits)
      shards.ranges.push_back({r, plans_[size_t(r)].vocab.begin, plans_[size_t(r)].vocab.end});
    if (lay[0].kind != ShardKind::ranges) continue;
    for (const ShardRange& range : lay[size_t(r)].ranges)
      shards.ranges.push_back({r, range.begin, range.end});
  }
  if (!g.problem.empty()) {
    // A split stage whose rows do not tile the full row is this backend's own fault.
    if (lay[0].kind == ShardKind::ranges) fail("hip group: {}", g.problem);
    shards.problem = g.problem;
    shards.problem_rank = g.rank;
    g.row = rows[size_t(std::max(g.rank, 0))].f32;
  }
  StageData d;
  d.type = StageData::Type::F32;
  d.dims = stage_dims(c_, s, pos);
  d.f32 = std::move(g.row);
  d.shards = std::move(shards);
  fetched_ = Fetched{s, layer, row, std::move(rows), std::move(parts)};  // for partials()
  return d;
}

void HipGroupBackend::write(Stage s, int layer, int row, const StageData& data) {
  fetched_.reset();
  const int n = degree();
  (void)position(row);
  std::vector<StageData> parts(ranks_.size(), data);
  for (StageData& p : parts) p.shards.reset();
  if (info(s).kind == ValueKind::Real && s != Stage::logits) {
    const std::vector<StageShard> lay = layouts(s, layer, row);
    for (int r = 0; r < n; ++r) {
      StageData& p = parts[size_t(r)];
      if (lay[0].kind == ShardKind::ranges) {
        p.type = StageData::Type::F32;
        p.f64.clear();
        p.f32.clear();
        for (const ShardRange& range : lay[size_t(r)].ranges)
          for (int i = range.begin; i < range.end; ++i) {
            if (size_t(i) >= data.size())
              fail("write {}: {} values for a row of {} or more", parity::name(s), data.size(),
                   i + 1);
            p.f32.push_back(float(data.at(size_t(i))));
          }
        p.dims = {p.f32.size()};
      } else if (lay[0].kind == ShardKind::partial && r != 0) {
        for (size_t i = 0; i < p.size(); ++i) p.set(i, 0.0);
      }
    }
  }
  on_ranks([&](int r) { ranks_[size_t(r)]->write(s, layer, row, parts[size_t(r)]); });
}

std::vector<StageData> HipGroupBackend::partials(Stage s, int layer, int row) {
  const bool fetched =
      fetched_.has_value() && fetched_->s == s && fetched_->layer == layer && fetched_->row == row;
  if (s == Stage::mlp2 && plans_[0].experts_split == ExpertSplit::by_intermediate) {
    if (fetched) return fetched_->rows;  // each rank's row is its partial sum
    std::vector<StageData> rows(ranks_.size());
    on_ranks([&](int r) { rows[size_t(r)] = ranks_[size_t(r)]->read(s, layer, row); });
    return rows;
  }
  if (!is_reduced(s)) return {};
  std::vector<std::optional<StageData>> parts(ranks_.size());
  if (fetched)
    parts = fetched_->parts;
  else
    on_ranks([&](int r) { parts[size_t(r)] = ranks_[size_t(r)]->own_partial(s, layer, row); });
  std::vector<StageData> out;
  for (auto& p : parts) {
    if (!p) return {};
    out.push_back(std::move(*p));
  }
  return out;
}

// Each rank's cache holds its KV heads: interleaved back into rows of every head.
std::optional<KvRows> HipGroupBackend::cache_rows(int seq, int layer, int first, int count) {
  std::vector<std::optional<KvRows>> parts(ranks_.size());
  on_ranks(
      [&](int r) { parts[size_t(r)] = ranks_[size_t(r)]->cache_rows(seq, layer, first, count); });
  const size_t d = size_t(c_.head_dim), kv = size_t(c_.num_key_value_heads) * d;
  KvRows out;
  out.count = count;
  out.k.assign(size_t(count) * kv, 0.0);
  out.v.assign(size_t(count) * kv, 0.0);
  for (size_t r = 0; r < parts.size(); ++r) {
    if (!parts[r]) return std::nullopt;
    const ShardRange heads = plans_[r].kv_heads;
    const size_t own = size_t(heads.size()) * d, at = size_t(heads.begin) * d;
    for (size_t p = 0; p < size_t(count); ++p)
      for (size_t i = 0; i < own; ++i) {
        out.k[p * kv + at + i] = parts[r]->k[p * own + i];
        out.v[p * kv + at + i] = parts[r]->v[p * own + i];
      }
  }
  return out;
}

}  // namespace device

std::unique_ptr<Backend> make_hip_group_backend(const Model& m,
                                                const device::DeviceOptions& options,
                                                std::span<const int> devices) {
  return std::make_unique<device::HipGroupBackend>(m, options, devices);
}

}  // namespace parity
