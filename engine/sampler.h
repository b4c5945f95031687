// Sampling one token from one row of float32 logits, defined exactly so that the device sampler
// (device/sample.hip, launch_f32_sample) draws the same token, row for row. Every sum is over
// integer (fixed-point) weights, hence exact and independent of the order of summation.
//
//   1. Greedy when temperature <= 0 or top_k == 1: the argmax, the lowest id on ties, NaN
//      skipped (+inf wins; 0 when every value is NaN): the `sampled` stage's decision.
//   2. Otherwise the candidates are the ids with a finite logit: NaN, -inf and +inf are never
//      drawn, and a row with no finite logit gives id 0. -0 and +0 are equal.
//      Order: logit descending, the lower id first among equal logits -- the ascending order of
//      the 64-bit key (descending_bits(logit) << 32) | id (sampling_order_key), unique per id.
//   3. top_k > 0 keeps the first top_k candidates of that order (all of them when fewer).
//   4. Weights, in float64: W_i = (uint64) nearbyint(exp((logit_i - logit_max) / temperature)
//      * 2^40), logit_max the largest finite logit (W = 0 without calling exp when the exponent
//      is below -28.5, where exp * 2^40 < 0.47 whatever exp's last bit). The largest candidate
//      has W = 2^40; sums are exact in uint64 for up to 2^23 candidates (kMaxSampleCandidates).
//   5. top_p < 1: S = sum of W over the top-k set, P = min(max(ceil(top_p * double(S)), 1), S);
//      keep the shortest prefix of the order whose cumulative W reaches P (at least one).
//   6. The draw: u in [0, 1) = sampling_uniform(seed, request, step); S' = sum of W over the
//      kept prefix; R = min((uint64)(u * double(S')), S' - 1); the token is the first candidate
//      of the prefix whose inclusive cumulative W exceeds R.
//
// Host and device evaluate every step with the same IEEE operations (subtraction, division,
// multiplication, ceil, rint: correctly rounded on both); the one place they may differ is exp,
// whose last bit the device's libm may round differently. That can move a W by one unit only
// when exp(.) * 2^40 lies within an ulp of a half-integer, and changes the token only when such
// a unit moves a cumulative sum across P or R: tests/device_sampler_test.cpp recomputes that
// condition and requires equality everywhere else.
//
// The generator is counter-based: u = top 53 bits of SplitMix64 chained over (seed, request,
// step) -- see sampling_uniform. A request's draws depend only on its own seed, id and step,
// never on which other requests share its batch or in which order they were admitted.
#pragma once
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace parity {

struct SamplingParams {
  double temperature = 0;  // 0: greedy; never negative
  int top_k = 0;           // 0: no top-k cut
  double top_p = 1;        // 1: no nucleus cut; (0, 1]
  uint64_t seed = 0;

  bool greedy() const { return temperature <= 0 || top_k == 1; }
  // Throws parity::Error naming a bad value (a negative top_k, top_p outside (0, 1], a
  // temperature that is negative or not finite).
  void validate() const;
};

// Fixed-point scale of the weights (step 4) and the most candidates whose weights sum exactly
// in uint64 (2^23 * 2^40 = 2^63). A longer row can only be sampled greedily.
inline constexpr double kSampleWeightScale = 0x1p40;
inline constexpr size_t kMaxSampleCandidates = size_t(1) << 23;

// SplitMix64's finaliser (Steele, Lea, Flood 2014): the mixing function of the generator.
uint64_t splitmix64(uint64_t x);

// The uniform number of draw `step` of request `request` under `seed`, in [0, 1):
//   x = splitmix64(seed); x = splitmix64(x ^ request); x = splitmix64(x ^ step);
//   u = (x >> 11) * 2^-53
double sampling_uniform(uint64_t seed, uint64_t request, uint64_t step);

// Step 2's order: the key of a finite logit at `id`; ascending keys are the draw order.
// descending_bits maps floats to uint32 in reverse order (-0 as +0).
uint32_t sampling_descending_bits(float logit);
uint64_t sampling_order_key(float logit, TokenId id);

// Step 4's weight of `logit` when the largest finite logit is `max_logit`.
uint64_t sampling_weight(float logit, float max_logit, double temperature);

// The greedy decision: argmax, the lowest index on ties, NaN skipped (0 when all are NaN).
TokenId greedy_token(std::span<const double> logits);
TokenId greedy_token(std::span<const float> logits);

// Steps 2-5 for a non-greedy draw: the top-k set in draw order with its weights, and how many of
// them the top-p prefix keeps (0 only when there is no candidate).
struct SamplingCandidates {
  std::vector<TokenId> order;
  std::vector<uint64_t> weight;
  size_t kept = 0;
};
// Throws parity::Error when the row is longer than kMaxSampleCandidates.
SamplingCandidates sampling_candidates(std::span<const float> logits, const SamplingParams& params);

// Step 6: the index into `c.order` that the uniform `u` selects (c.kept > 0).
size_t sampling_draw_index(const SamplingCandidates& c, double u);

// The token of draw `step` of request `request` (the definition above).
TokenId sample_token(std::span<const float> logits, const SamplingParams& params, uint64_t request,
                     uint64_t step);
// The same on float64 logits (a reference backend's row), each rounded to float32 first: the
// definition is over float32, the dtype the device samples.
TokenId sample_token(std::span<const double> logits, const SamplingParams& params,
                     uint64_t request, uint64_t step);

// The distribution step 6 draws from, W_i / S' per id (0 for ids cut away; greedy: 1 at the
// argmax): what the tests check the draws against.
std::vector<double> sampling_distribution(std::span<const float> logits,
                                          const SamplingParams& params);

}  // namespace parity
