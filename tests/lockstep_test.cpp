// The lockstep run and its replay (teacher forcing): a replayed stage computes exactly what the
// candidate's op gives on the reference's inputs rounded to the candidate's precision -- KV cache
// included -- the free-running rows are untouched by the replay, untraced positions skip the head
// and nothing else, generation follows the reference's (or the candidate's) argmax, and bad
// options are refused before anything runs.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <tuple>

#include "model/checkpoint.h"
#include "model/error.h"
#include "model/lockstep.h"
#include "reference/cpu_backend.h"
#include "reference/ops.h"
#include "tests/test_util.h"

namespace parity {
namespace {
using test::as_float;

// Every recorded row, by (series, position, layer, stage).
struct Rows : Observer {
  std::map<std::tuple<Series, int, int, Stage>, StageData> rows;
  bool wants(int, int, Stage) const override { return true; }
  void record(const StageKey& k, const StageData& d) override {
    rows[{k.series, k.position, k.layer, k.stage}] = d;
  }
  const StageData& at(Series s, int pos, int layer, Stage st) const {
    const auto it = rows.find({s, pos, layer, st});
    if (it == rows.end())
      throw std::runtime_error(fmt::format("no {} row of {} at position {}, layer {}",
                                           int(s), name(st), pos, layer));
    return it->second;
  }
  bool has(Series s, int pos, int layer, Stage st) const {
    return rows.contains({s, pos, layer, st});
  }
};

std::vector<int32_t> prompt(int n, int vocab) {
  std::vector<int32_t> t;
  for (int i = 0; i < n; ++i) t.push_back(int32_t((3 + 131 * i) % vocab));
  return t;
}

class Lockstep : public ::testing::Test {
 protected:
  std::unique_ptr<Model> m = Model::load(test::tiny_model_dir());
  const Config& c = m->config;
};

TEST_F(Lockstep, ReplayedStagesRunOnTheReferenceInputsRoundedToFloat) {
  auto ref = make_reference_backend(*m);
  auto cand = make_cpu_f32_backend(*m);
  LockstepOptions o;
  o.prompt = prompt(12, c.vocab_size);  // past the window of 8
  for (int p = 0; p < 12; ++p) o.traced.insert(p);
  o.step_rows = 5;  // steps that split the prompt unevenly
  Rows r_obs, c_obs;
  run_lockstep(*ref, *cand, &r_obs, &c_obs, o);

  const int L = 2, d = c.head_dim, nH = c.num_attention_heads, nKV = c.num_key_value_heads;
  for (int pos : {0, 7, 11}) {
    // attn_norm: rmsnorm of the reference's residual (resid_ffn of layer L-1), in float.
    const auto x = as_float(r_obs.at(Series::output, pos, L - 1, Stage::resid_ffn));
    std::vector<float> scale(size_t(c.hidden_size)), y(size_t(c.hidden_size));
    read_vector(*m->layers[L].attn_norm, scale.data());
    ref::rmsnorm(x.data(), scale.data(), c.hidden_size, c.rms_norm_eps, y.data());
    const StageData& local = c_obs.at(Series::replay, pos, L, Stage::attn_norm);
    ASSERT_EQ(local.f32.size(), y.size());
    EXPECT_EQ(std::memcmp(local.f32.data(), y.data(), y.size() * sizeof(float)), 0) << "pos " << pos;

    // scores: the reference's q_rope against the reference's k_rope rows of positions 0..pos.
    std::vector<float> kcache;
    for (int j = 0; j <= pos; ++j) {
      const auto k = as_float(r_obs.at(Series::output, j, L, Stage::k_rope));
      kcache.insert(kcache.end(), k.begin(), k.end());
    }
    const auto q = as_float(r_obs.at(Series::output, pos, L, Stage::q_rope));
    std::vector<float> sinks(static_cast<size_t>(nH)), s(static_cast<size_t>(nH) * size_t(pos + 2));
    read_vector(*m->layers[L].sinks, sinks.data());
    ref::attention_scores(q.data(), kcache.data(), sinks.data(), nH, nKV, d, pos,
                          c.sliding(L) ? c.sliding_window : 0, s.data());
    const StageData& ls = c_obs.at(Series::replay, pos, L, Stage::scores);
    ASSERT_EQ(ls.f32.size(), s.size());
    EXPECT_EQ(std::memcmp(ls.f32.data(), s.data(), s.size() * sizeof(float)), 0) << "pos " << pos;
  }
}

TEST_F(Lockstep, FreeRowsAreTheSameWithAndWithoutReplay) {
  LockstepOptions o;
  o.prompt = prompt(10, c.vocab_size);
  for (int p = 0; p < 10; ++p) o.traced.insert(p);
  Rows with, without, unused;
  {
    auto ref = make_reference_backend(*m);
    auto cand = make_cpu_f32_backend(*m);
    run_lockstep(*ref, *cand, &unused, &with, o);
  }
  o.replay = false;
  {
    auto ref = make_reference_backend(*m);
    auto cand = make_cpu_f32_backend(*m);
    run_lockstep(*ref, *cand, &unused, &without, o);
  }
  size_t compared = 0;
  for (const auto& [key, row] : without.rows) {
    EXPECT_NE(std::get<0>(key), Series::replay) << "no replay rows without replay";
    const StageData& other = with.rows.at(key);
    ASSERT_EQ(other.size(), row.size());
    for (size_t i = 0; i < row.size(); ++i)
      ASSERT_EQ(std::bit_cast<uint64_t>(other.at(i)), std::bit_cast<uint64_t>(row.at(i)))
          << name(std::get<3>(key)) << " element " << i;
    ++compared;
  }
  EXPECT_EQ(compared, size_t(10 * stages_per_position(c)));
  size_t replayed = 0;
  for (const auto& [key, row] : with.rows) replayed += std::get<0>(key) == Series::replay;
  EXPECT_EQ(replayed, compared);
}

TEST_F(Lockstep, ReferenceRowsCarryMagnitudesOfTheirSums) {
  auto ref = make_reference_backend(*m);
  auto cand = make_cpu_f32_backend(*m);
  LockstepOptions o;
  o.prompt = prompt(3, c.vocab_size);
  o.traced = {2};
  Rows r_obs, c_obs;
  run_lockstep(*ref, *cand, &r_obs, &c_obs, o);
  for (Stage s : {Stage::qkv, Stage::scores, Stage::attn_out, Stage::o_proj, Stage::router,
                  Stage::mlp1, Stage::mlp2})
    for (int L = 0; L < c.num_hidden_layers; ++L) {
      const StageData& y = r_obs.at(Series::output, 2, L, s);
      const StageData& mag = r_obs.at(Series::magnitude, 2, L, s);
      ASSERT_EQ(mag.size(), y.size()) << name(s);
      for (size_t i = 0; i < y.size(); ++i) {
        if (std::isinf(y.at(i))) continue;  // masked scores
        // The sum of |terms| bounds the sum itself.
        EXPECT_GE(mag.at(i) * (1 + 1e-12), std::fabs(y.at(i))) << name(s) << " " << i;
      }
    }
  EXPECT_TRUE(r_obs.has(Series::magnitude, 2, kModelLayer, Stage::logits));
  EXPECT_FALSE(r_obs.has(Series::magnitude, 2, 0, Stage::swiglu)) << "elementwise: no sums";
  EXPECT_FALSE(c_obs.has(Series::magnitude, 2, 0, Stage::qkv)) << "only the reference has them";
}

TEST_F(Lockstep, UntracedPositionsSkipOnlyTheHead) {
  LockstepOptions o;
  o.prompt = prompt(10, c.vocab_size);
  o.traced = {9};
  o.step_rows = 3;
  Rows r_part, c_part, r_all, c_all;
  {
    auto ref = make_reference_backend(*m);
    auto cand = make_cpu_f32_backend(*m);
    run_lockstep(*ref, *cand, &r_part, &c_part, o);
  }
  for (const auto& [key, row] : r_part.rows) EXPECT_EQ(std::get<1>(key), 9);
  o.traced.clear();
  for (int p = 0; p < 10; ++p) o.traced.insert(p);
  {
    auto ref = make_reference_backend(*m);
    auto cand = make_cpu_f32_backend(*m);
    run_lockstep(*ref, *cand, &r_all, &c_all, o);
  }
  for (const auto& [key, row] : c_part.rows) {
    const StageData& full = c_all.rows.at(key);
    ASSERT_EQ(full.size(), row.size());
    for (size_t i = 0; i < row.size(); ++i)
      ASSERT_EQ(full.at(i), row.at(i)) << name(std::get<3>(key)) << " series "
                                       << int(std::get<0>(key));
  }
}

TEST_F(Lockstep, GenerationFollowsTheReferenceOrTheCandidate) {
  LockstepOptions o;
  o.prompt = prompt(5, c.vocab_size);
  o.traced = {4};
  o.generate = 4;
  Rows r_obs, c_obs;
  auto ref = make_reference_backend(*m);
  auto cand = make_cpu_f32_backend(*m);
  const LockstepResult res = run_lockstep(*ref, *cand, &r_obs, &c_obs, o);
  ASSERT_EQ(res.tokens.size(), 9u);
  for (int p = 4; p < 8; ++p)  // the token at p + 1 is the reference's argmax at p
    EXPECT_EQ(res.tokens[size_t(p + 1)], r_obs.at(Series::output, p, kModelLayer, Stage::sampled).i32[0]);
  EXPECT_TRUE(c_obs.has(Series::output, 8, kModelLayer, Stage::sampled));
  EXPECT_TRUE(c_obs.has(Series::replay, 8, kModelLayer, Stage::sampled));

  o.free_run = true;
  Rows r2, c2;
  const LockstepResult free = run_lockstep(*ref, *cand, &r2, &c2, o);
  for (int p = 4; p < 8; ++p)
    EXPECT_EQ(free.tokens[size_t(p + 1)], c2.at(Series::output, p, kModelLayer, Stage::sampled).i32[0]);
}

// A candidate whose stage outputs cannot be overwritten cannot be replayed.
class ReadOnly : public test::ForwardingBackend {
 public:
  using ForwardingBackend::ForwardingBackend;
  std::string name() const override { return "read-only"; }
  bool writable(Stage s) const override { return s != Stage::ffn_norm; }
};

// A candidate that declares attn_out not replayable (its kernel does not read att).
class AttnOutNotReplayed : public test::ForwardingBackend {
 public:
  using ForwardingBackend::ForwardingBackend;
  bool replays(Stage s, int) const override { return s != Stage::attn_out; }
};

TEST_F(Lockstep, AStageTheCandidateCannotReplayIsRecomputedFromItsOwnRows) {
  // The reference's recompute rows of attn_out are its sum over the candidate's own att row and
  // the candidate's own value rows of the cache (float64), with their magnitude rows; every
  // other stage has none.
  auto ref = make_reference_backend(*m);
  AttnOutNotReplayed cand(make_cpu_f32_backend(*m));
  LockstepOptions o;
  o.prompt = prompt(12, c.vocab_size);  // past the window of 8
  for (int p : {0, 7, 11}) o.traced.insert(p);
  o.step_rows = 5;
  Rows r_obs, c_obs;
  run_lockstep(*ref, cand, &r_obs, &c_obs, o);
  const int nH = c.num_attention_heads, nKV = c.num_key_value_heads, d = c.head_dim;
  for (int L : {1, 2})  // a full and a sliding layer
    for (int pos : {0, 7, 11}) {
      SCOPED_TRACE(fmt::format("layer {}, position {}", L, pos));
      const StageData& att = c_obs.at(Series::output, pos, L, Stage::att);
      const std::optional<KvRows> cache = cand.cache_rows(0, L, 0, pos + 1);
      ASSERT_TRUE(cache.has_value());
      std::vector<double> p(att.size()), want(size_t(nH) * d), want_m(want.size());
      for (size_t i = 0; i < p.size(); ++i) p[i] = att.at(i);
      ref::attention_output(p.data(), cache->v.data(), nH, nKV, d, pos, want.data());
      ref::attention_output_magnitude(p.data(), cache->v.data(), nH, nKV, d, pos, want_m.data());
      const StageData& got = r_obs.at(Series::recompute, pos, L, Stage::attn_out);
      const StageData& got_m = r_obs.at(Series::recompute_magnitude, pos, L, Stage::attn_out);
      ASSERT_EQ(got.size(), want.size());
      for (size_t i = 0; i < want.size(); ++i) {
        EXPECT_EQ(got.at(i), want[i]) << i;
        EXPECT_EQ(got_m.at(i), want_m[i]) << i;
      }
      EXPECT_FALSE(r_obs.has(Series::recompute, pos, L, Stage::scores));
      EXPECT_FALSE(r_obs.has(Series::recompute, pos, L, Stage::o_proj));
    }
}

TEST_F(Lockstep, BadOptionsAreRefusedBeforeAnythingRuns) {
  auto ref = make_reference_backend(*m);
  auto cand = make_cpu_f32_backend(*m);
  auto expect_error = [&](LockstepOptions o, Backend& candidate, const std::string& part) {
    try {
      check_lockstep(o, *ref, candidate);
      ADD_FAILURE() << "expected an error naming " << part;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
    }
  };
  LockstepOptions o;
  o.prompt = prompt(4, c.vocab_size);
  LockstepOptions past = o;
  past.generate = c.max_position_embeddings;
  expect_error(past, *cand, "--generate");
  LockstepOptions outside = o;
  outside.traced = {4};
  expect_error(outside, *cand, "traced position 4");
  LockstepOptions bad_token = o;
  bad_token.prompt[2] = c.vocab_size;
  expect_error(bad_token, *cand, "token id");
  ReadOnly ro(make_cpu_f32_backend(*m));
  expect_error(o, ro, "cannot replay stage router");
  LockstepOptions no_replay = o;
  no_replay.replay = false;
  EXPECT_NO_THROW(check_lockstep(no_replay, *ref, ro));
}

}  // namespace
}  // namespace parity
