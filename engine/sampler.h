// Sampling one token from one row of logits, defined exactly so that a device sampler can match
// it token for token:
//
//   1. Greedy when temperature <= 0 or top_k == 1: the argmax, the lowest id on ties, NaN
//      skipped (the `sampled` stage's decision, reference/sampled.cpp).
//   2. Otherwise, in float64 on the host: the candidates are the ids with a finite logit (NaN
//      and -inf never drawn; a row with none is id 0), z_i = logit_i / temperature, ordered by z
//      descending, the lower id first on ties.
//   3. top_k > 0 keeps the first top_k candidates of that order (all of them when fewer).
//   4. Weights w_i = exp(z_i - z_max); p_i = w_i / sum(w) over the kept candidates, summed in
//      that order.
//   5. top_p < 1 keeps the shortest prefix of that order whose cumulative p reaches top_p (at
//      least one candidate): top-k first, then top-p on the renormalised top-k distribution.
//   6. The draw: u in [0, 1) from the request's generator; the token is the first candidate of
//      the prefix whose cumulative weight exceeds u * (sum of the prefix's weights), walking in
//      that order (the last one if rounding leaves none).
//
// The generator is counter-based: u = top 53 bits of SplitMix64 chained over (seed, request,
// step) -- see sampling_uniform. A request's draws depend only on its own seed, id and step,
// never on which other requests share its batch or in which order they were admitted.
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "engine/tokenizer.h"

namespace parity {

struct SamplingParams {
  double temperature = 0;  // <= 0: greedy
  int top_k = 0;           // 0: no top-k cut
  double top_p = 1;        // 1: no nucleus cut; (0, 1]
  uint64_t seed = 0;

  bool greedy() const { return temperature <= 0 || top_k == 1; }
  // Throws parity::Error naming a bad value (a negative top_k, top_p outside (0, 1], a
  // temperature that is not finite).
  void validate() const;
};

// SplitMix64's finaliser (Steele, Lea, Flood 2014): the mixing function of the generator.
uint64_t splitmix64(uint64_t x);

// The uniform number of draw `step` of request `request` under `seed`, in [0, 1):
//   x = splitmix64(seed); x = splitmix64(x ^ request); x = splitmix64(x ^ step);
//   u = (x >> 11) * 2^-53
double sampling_uniform(uint64_t seed, uint64_t request, uint64_t step);

// The greedy decision: argmax, the lowest index on ties, NaN skipped (0 when all are NaN).
TokenId greedy_token(std::span<const double> logits);
TokenId greedy_token(std::span<const float> logits);

// The token of draw `step` of request `request` (the definition above).
TokenId sample_token(std::span<const double> logits, const SamplingParams& params, uint64_t request,
                     uint64_t step);

// The distribution step 6 draws from, as probabilities per id (0 for ids cut away): what the
// tests check the draws against.
std::vector<double> sampling_distribution(std::span<const double> logits,
                                          const SamplingParams& params);

}  // namespace parity
