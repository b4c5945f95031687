#include "device/runtime/shard_plan.h"

#include <fmt/format.h>

#include <algorithm>

#include "model/error.h"
#include "model/untrusted.h"

namespace parity::device {

std::string expert_split_name(ExpertSplit s) {
  return s == ExpertSplit::by_expert ? "by-expert" : "by-intermediate";
}

ExpertSplit expert_split_from_name(const std::string& name) {
  if (name == "by-expert") return ExpertSplit::by_expert;
  if (name == "by-intermediate") return ExpertSplit::by_intermediate;
  fail("expert split {}: expected by-expert or by-intermediate", quoted(name));
}

ShardRange split_range(int n, int parts, int part, int unit) {
  PARITY_CHECK(n >= 0 && parts >= 1 && part >= 0 && part < parts && unit >= 1,
               "split_range({}, {}, {}, {})", n, parts, part, unit);
  const int64_t units = (int64_t(n) + unit - 1) / unit;
  const int64_t base = units / parts, extra = units % parts;
  const int64_t begin = part * base + std::min<int64_t>(part, extra);
  const int64_t end = begin + base + (part < extra ? 1 : 0);
  return {int(std::min<int64_t>(n, begin * unit)), int(std::min<int64_t>(n, end * unit))};
}

std::string tensor_parallel_problem(const Config& c, int degree, ExpertSplit split) {
  if (degree < 1) return fmt::format("tensor parallel degree {}: must be at least 1", degree);
  const auto not_dividing = [&](int n, const char* what) {
    return fmt::format("tensor parallel degree {} does not divide the model's {} {}", degree, n,
                       what);
  };
  if (c.num_attention_heads % degree != 0) return not_dividing(c.num_attention_heads, "query heads");
  if (c.num_key_value_heads % degree != 0) return not_dividing(c.num_key_value_heads, "KV heads");
  if (split == ExpertSplit::by_expert && c.num_local_experts % degree != 0)
    return not_dividing(c.num_local_experts, "experts") + " (split them by-intermediate instead)";
  if (split == ExpertSplit::by_intermediate &&
      (c.intermediate_size + kShardBlock - 1) / kShardBlock < degree)
    return fmt::format(
        "tensor parallel degree {}: the experts' intermediate size {} has fewer blocks of {} "
        "than ranks",
        degree, c.intermediate_size, kShardBlock);
  if (c.vocab_size < degree)
    return fmt::format("tensor parallel degree {}: more ranks than the {} vocabulary rows", degree,
                       c.vocab_size);
  return {};
}

ShardPlan ShardPlan::of(const Config& c, int degree, int rank, ExpertSplit split) {
  if (const std::string problem = tensor_parallel_problem(c, degree, split); !problem.empty())
    fail("{}", problem);
  if (rank < 0 || rank >= degree)
    fail("tensor parallel rank {} of a group of {}", rank, degree);
  ShardPlan p;
  p.degree = degree;
  p.rank = rank;
  p.experts_split = split;
  const int d = c.head_dim;
  p.q_heads = split_range(c.num_attention_heads, degree, rank);
  p.kv_heads = split_range(c.num_key_value_heads, degree, rank);
  p.q_rows = {p.q_heads.begin * d, p.q_heads.end * d};
  p.k_rows = {c.q_dim() + p.kv_heads.begin * d, c.q_dim() + p.kv_heads.end * d};
  p.v_rows = {c.q_dim() + c.kv_dim() + p.kv_heads.begin * d,
              c.q_dim() + c.kv_dim() + p.kv_heads.end * d};
  p.o_proj_cols = p.q_rows;
  p.experts = split == ExpertSplit::by_expert ? split_range(c.num_local_experts, degree, rank)
                                              : ShardRange{0, c.num_local_experts};
  p.intermediate = split == ExpertSplit::by_intermediate
                       ? split_range(c.intermediate_size, degree, rank, kShardBlock)
                       : ShardRange{0, c.intermediate_size};
  p.vocab = split_range(c.vocab_size, degree, rank);
  return p;
}

Config rank_config(const Config& c, const ShardPlan& p) {
  Config r = c;
  r.num_attention_heads = p.q_heads.size();
  r.num_key_value_heads = p.kv_heads.size();
  r.intermediate_size = p.intermediate.size();
  return r;
}

int64_t shard_join_floats(const Config& c, int degree, int rows, int join_rows) {
  const int64_t vocab_part = (int64_t(c.vocab_size) + degree - 1) / degree;
  return std::max(int64_t(rows) * c.hidden_size, int64_t(join_rows) * vocab_part);
}

int ShardPlan::rank_of_expert(int expert) const {
  if (experts_split == ExpertSplit::by_intermediate) return -1;
  const int per_rank = experts.size();  // every rank owns as many (the degree divides them)
  return expert / per_rank;
}

}  // namespace parity::device
