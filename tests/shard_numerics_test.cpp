// A tensor-parallel group's arithmetic on the host, in float64: each rank computes its part of a
// layer of the tiny model from the slices of the weights that the device weight plan gives it
// (plan_weights with a ShardPlan), and the group's rows are gathered as the shard layout says
// (device/runtime/shard_layout.h). The split stages gather to the unsplit computation's values,
// bit for bit once rounded to float (each element is the same sum on its rank); the partial sums
// of o_proj, mlp2 (by_intermediate) and moe_out add to the unsplit values within float64's
// rounding, each bias added once; the shards' largest logits give the unsplit greedy token. This
// is what the sharded device engine computes, its bookkeeping checked where no GPU is needed.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <vector>

#include "device/runtime/shard_layout.h"
#include "device/runtime/weight_plan.h"
#include "model/backend.h"
#include "model/checkpoint.h"
#include "reference/ops.h"
#include "test_util.h"

namespace parity::device {
namespace {

using Vec = std::vector<double>;

// Rows `rows` of W x (+ b): each the sum over the columns `cols` in column order.
Vec linear_rows(const Linear& l, ShardRange rows, ShardRange cols, const Vec& x, bool bias) {
  Vec w(size_t(l.in)), b(size_t(l.out), 0.0), y;
  if (l.bias != nullptr && bias) read_vector(*l.bias, b.data());
  for (int j = rows.begin; j < rows.end; ++j) {
    read_row(*l.weight, j, l.in, w.data());
    double s = 0;
    for (int c = cols.begin; c < cols.end; ++c) s += w[size_t(c)] * x[size_t(c)];
    y.push_back(s + b[size_t(j)]);
  }
  return y;
}

// Rows `rows` of W[e] x (+ b[e]), x indexed by the columns `cols` (x[i] is column cols.begin + i).
Vec expert_rows(const ExpertLinear& l, int e, ShardRange rows, ShardRange cols, const Vec& x,
                bool bias) {
  Vec w(size_t(l.in)), b(size_t(l.experts) * size_t(l.out), 0.0), y;
  if (bias) read_vector(*l.bias, b.data());
  for (int j = rows.begin; j < rows.end; ++j) {
    read_expert_row(l, e, j, w.data());
    double s = 0;
    for (int c = cols.begin; c < cols.end; ++c) s += w[size_t(c)] * x[size_t(c - cols.begin)];
    y.push_back(s + b[size_t(e) * size_t(l.out) + size_t(j)]);
  }
  return y;
}

std::vector<float> to_float(const Vec& v) {
  return {v.begin(), v.end()};
}

Vec random_vec(std::mt19937_64& rng, int n) {
  std::uniform_real_distribution<double> u(-2.0, 2.0);
  Vec v(static_cast<size_t>(n));
  for (double& x : v) x = u(rng);
  return v;
}

// The gathered full row of a split stage, whose rows the ranks computed as `rows`.
std::vector<float> gathered(Stage s, const std::vector<StageShard>& layouts,
                            const std::vector<Vec>& rows, int64_t size) {
  std::vector<std::vector<float>> f;
  for (const Vec& r : rows) f.push_back(to_float(r));
  std::vector<RankRow> rr;
  for (const auto& r : f) rr.push_back({r, {}});
  const Gathered g = gather_shards(s, layouts, rr, size);
  EXPECT_EQ(g.problem, "") << name(s);
  return g.row;
}

void expect_sums(const std::vector<Vec>& partials, const Vec& full, const char* what) {
  for (size_t i = 0; i < full.size(); ++i) {
    double sum = 0, mag = 0;
    for (const Vec& p : partials) sum += p[i], mag += std::fabs(p[i]);
    EXPECT_NEAR(sum, full[i], 1e-12 * (mag + std::fabs(full[i]))) << what << " element " << i;
  }
}

TEST(ShardNumerics, ARanksSlicesComputeTheLayerTheWholeModelComputes) {
  const auto model = Model::load(test::tiny_model_dir());
  const Config& c = model->config;
  const LayerWeights& l = model->layers[0];
  const int H = c.hidden_size, I = c.intermediate_size, k = c.num_experts_per_tok;
  std::mt19937_64 rng(21);
  const Vec xn = random_vec(rng, H), att = random_vec(rng, c.q_dim());
  std::vector<int32_t> topk(size_t(c.num_local_experts));
  for (int e = 0; e < c.num_local_experts; ++e) topk[size_t(e)] = e;
  std::shuffle(topk.begin(), topk.end(), rng);
  topk.resize(size_t(k));
  const Vec topk_w = random_vec(rng, k);

  // The whole model's values.
  const ShardRange all_in{0, H};
  Vec qkv = linear_rows(l.q, {0, l.q.out}, all_in, xn, true);
  for (const Linear* p : {&l.k, &l.v}) {
    const Vec part = linear_rows(*p, {0, p->out}, all_in, xn, true);
    qkv.insert(qkv.end(), part.begin(), part.end());
  }
  const Vec o_proj = linear_rows(l.o, {0, H}, {0, c.q_dim()}, att, true);
  Vec mlp1, swiglu, mlp2, moe_out(size_t(H), 0.0);
  for (int j = 0; j < k; ++j) {
    const Vec h = expert_rows(l.mlp1, topk[size_t(j)], {0, 2 * I}, all_in, xn, true);
    Vec a(static_cast<size_t>(I));
    ref::swiglu(h.data(), I, c.swiglu_alpha, c.swiglu_limit, a.data());
    const Vec y = expert_rows(l.mlp2, topk[size_t(j)], {0, H}, {0, I}, a, true);
    mlp1.insert(mlp1.end(), h.begin(), h.end());
    swiglu.insert(swiglu.end(), a.begin(), a.end());
    mlp2.insert(mlp2.end(), y.begin(), y.end());
    for (int i = 0; i < H; ++i) moe_out[size_t(i)] += topk_w[size_t(j)] * y[size_t(i)];
  }
  const Vec logits = linear_rows(model->lm_head, {0, c.vocab_size}, all_in, xn, false);
  const int64_t greedy = std::max_element(logits.begin(), logits.end()) - logits.begin();

  for (const ExpertSplit split : {ExpertSplit::by_expert, ExpertSplit::by_intermediate}) {
    SCOPED_TRACE(expert_split_name(split));
    constexpr int kDegree = 2;
    std::map<Stage, std::vector<StageShard>> layouts;
    std::vector<Vec> r_qkv, r_o, r_mlp1, r_swiglu, r_mlp2, r_moe, r_logits;
    for (int r = 0; r < kDegree; ++r) {
      const ShardPlan shard = ShardPlan::of(c, kDegree, r, split);
      const WeightPlan wp = plan_weights(*model, shard);
      for (const Stage s : {Stage::qkv, Stage::mlp1, Stage::swiglu, Stage::mlp2, Stage::logits})
        layouts[s].push_back(stage_shard(s, c, shard, topk, 0));
      const auto slice = [&](const TensorView* t) { return wp.find(t).slice; };
      // qkv: the rank's rows of q, k and v (their slices within each projection).
      Vec row;
      for (const Linear* p : {&l.q, &l.k, &l.v}) {
        const Vec part = linear_rows(*p, slice(p->weight).rows, slice(p->weight).cols, xn, true);
        row.insert(row.end(), part.begin(), part.end());
      }
      r_qkv.push_back(row);
      // o_proj: its heads' columns, the bias on the rank that adds the reduced biases.
      r_o.push_back(linear_rows(l.o, slice(l.o.weight).rows, slice(l.o.weight).cols, att,
                                shard.adds_reduced_bias()));
      // The experts: the slots of its experts whole (by_expert), or its slice of every slot's
      // intermediate columns with mlp2's partial sums (by_intermediate).
      const WeightSlice s1 = slice(l.mlp1.blocks), s2 = slice(l.mlp2.blocks);
      Vec h_row, a_row, y_row, moe(size_t(H), 0.0);
      for (int j = 0; j < k; ++j) {
        const int e = topk[size_t(j)];
        if (!s1.experts.contains(e)) continue;
        const Vec h = expert_rows(l.mlp1, e, s1.rows, s1.cols, xn, true);
        Vec a(h.size() / 2);
        ref::swiglu(h.data(), int(a.size()), c.swiglu_alpha, c.swiglu_limit, a.data());
        const bool bias = split == ExpertSplit::by_expert || shard.adds_reduced_bias();
        const Vec y = expert_rows(l.mlp2, e, s2.rows, s2.cols, a, bias);
        h_row.insert(h_row.end(), h.begin(), h.end());
        a_row.insert(a_row.end(), a.begin(), a.end());
        y_row.insert(y_row.end(), y.begin(), y.end());
        for (int i = 0; i < H; ++i) moe[size_t(i)] += topk_w[size_t(j)] * y[size_t(i)];
      }
      r_mlp1.push_back(h_row);
      r_swiglu.push_back(a_row);
      r_mlp2.push_back(y_row);
      r_moe.push_back(moe);
      const WeightSlice sv = slice(model->lm_head.weight);
      r_logits.push_back(linear_rows(model->lm_head, sv.rows, sv.cols, xn, false));
    }
    EXPECT_EQ(gathered(Stage::qkv, layouts[Stage::qkv], r_qkv, c.qkv_dim()), to_float(qkv));
    EXPECT_EQ(gathered(Stage::mlp1, layouts[Stage::mlp1], r_mlp1, int64_t(k) * 2 * I),
              to_float(mlp1));
    EXPECT_EQ(gathered(Stage::swiglu, layouts[Stage::swiglu], r_swiglu, int64_t(k) * I),
              to_float(swiglu));
    if (split == ExpertSplit::by_expert)
      EXPECT_EQ(gathered(Stage::mlp2, layouts[Stage::mlp2], r_mlp2, int64_t(k) * H),
                to_float(mlp2));
    else
      expect_sums(r_mlp2, mlp2, "mlp2");
    expect_sums(r_o, o_proj, "o_proj");
    expect_sums(r_moe, moe_out, "moe_out");
    const std::vector<float> lg =
        gathered(Stage::logits, layouts[Stage::logits], r_logits, c.vocab_size);
    EXPECT_EQ(lg, to_float(logits));
    // The greedy token from the shards: each rank's largest, then the largest of those (the
    // lower rank, holding the lower vocabulary rows, on a tie).
    int64_t best = -1;
    double best_v = -INFINITY;
    int64_t offset = 0;
    for (const Vec& part : r_logits) {
      const int64_t i = std::max_element(part.begin(), part.end()) - part.begin();
      if (part[size_t(i)] > best_v) best = offset + i, best_v = part[size_t(i)];
      offset += int64_t(part.size());
    }
    EXPECT_EQ(best, greedy);
  }
}

}  // namespace
}  // namespace parity::device
