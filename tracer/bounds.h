// Error bounds derived from the reference's own values: for every stage, a per-element bound on
// the local error of a correct implementation at the candidate's precision -- the error the
// stage itself may make on given inputs. Two ways to give it those inputs, one bound each:
//   replay     the candidate runs the stage on the reference's inputs (model/lockstep.h),
//              rounded to its storage: the inputs' rounding is part of its local error
//   recompute  the reference recomputes the stage from the candidate's own stored inputs
//              (model/recompute.h): only what the stage itself rounds remains
// (BoundOptions::own_inputs). A candidate stage whose local error exceeds its bound did
// something other than round: that stage is the culprit.
//
// The rounding model (PrecisionPolicy, model/precision.h, per stage): stored activations carry
// a relative error up to u_s (storage), inputs rounded again to a coarser operand format u_o,
// every elementary operation up to u_a (accumulation), every intermediate result the stage
// materializes up to u_e, every elementary function (exp, sin, cos, sqrt, division) up to F u_a;
// a sum rounded before its bias is added errs by u_b of the sum.
//
// Sums of n terms (dot products, softmax denominators, norms): the probabilistic bound of
// Higham and Mary (SIAM J. Sci. Comput. 41(5), 2019): the rounding errors of a sum, in any
// order, modelled as independent and mean-zero, each at most u_a times a partial sum, itself at
// most sum |terms|. With the variance of a uniformly distributed rounding error (u_a^2 / 3) the
// error's standard deviation is at most u_a sqrt(n / 3) sum |terms|, so lambda sqrt(n) u_a
// sum |terms| with lambda = 4 is 6.9 standard deviations: about one sum in 10^11 of a correct
// implementation would exceed it, and in practice far fewer, since partial sums of terms of
// both signs stay well below sum |terms|. The worst-case bound gamma_n = n u / (1 - n u) is
// sqrt(n) / lambda times looser (13x at n = 2880) and is attained by no real accumulation: it
// would hide every bug smaller than about 1e-4 of the terms, e.g. an RMSNorm eps off by 10x.
// Below n = lambda^2 the worst case n u is the smaller, and is used: a sum of 4 routed experts
// errs by at most 4 u_a of its terms. `safety` multiplies every bound (default 1).
//
// The RMSNorm's row scale: every element of a norm's output shares one factor r = 1/sqrt(ms +
// eps), so an error in r (an eps of 1e-6, a mean over n - 1) moves the whole row by one relative
// amount, which in bfloat16 can hide under each element's own rounding. Fitting that amount,
// delta = sum e_i y_i / sum y_i^2 over the row, and holding it to r's own error plus 1.5 lambda
// standard deviations of what the elements' independent roundings leave in the fit (each at
// most a uniform error within its bound: variance bound^2 / 3) finds it (row_scale_bound).
//
// The formula of each stage is written next to its code in bounds.cpp and listed by
// bound_formula() for the reports.
#pragma once
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "model/forward.h"

namespace parity {

// A reference row a bound needs and its source does not have (Series::output or magnitude).
struct MissingBoundInput {
  StageRef ref;
  Series series = Series::output;
};

struct BoundOptions {
  double lambda = 4;      // probabilistic factor of sums (see above)
  double angle_ulps = 8;  // RoPE angle error, in u_a per unit of angle (inv_freq in float from
                          // pow/exp and the YaRN blend, then pos * inv_freq)
  double safety = 1;      // multiplies every bound
  // The stage's inputs are the candidate's own stored values (recompute), not the reference's
  // rounded by the candidate (replay).
  bool own_inputs = false;
};

// The reference values one stage's bound is derived from, at one position.
class BoundSource {
 public:
  virtual ~BoundSource() = default;
  // The reference's output of (stage, layer) at this position; throws MissingBoundInput when it
  // is not there.
  virtual const StageData& output(Stage s, int layer) = 0;
  // The reference's magnitude row of (stage, layer), or null when the trace has none.
  virtual const StageData* magnitude(Stage s, int layer) = 0;
  // |bias| per element of a projection (stage, layer), or null when the trace has none.
  virtual const StageData* bias(Stage, int /*layer*/) { return nullptr; }
  // A tensor-parallel candidate's partial sums of (stage, layer), one row per rank, where its
  // row of the stage is their gathered sum and the next stage summed the partials themselves
  // (mlp2's, split by intermediate columns, which moe_out adds up per rank); empty otherwise.
  virtual std::vector<const StageData*> partials(Stage, int /*layer*/) { return {}; }
};

// Per-element bound of stage (s, layer) at `position`, one per element of its output row. For a
// decision stage (topk_idx, sampled), the bound of the values it decides on (the router logits,
// the logits). Throws MissingBoundInput when a needed reference row is missing, parity::Error
// when one has the wrong size.
std::vector<double> derive_bound(const Config& c, Stage s, int layer, int position,
                                 BoundSource& source, const PrecisionPolicy& policy,
                                 const BoundOptions& options);

// Whether the stage's bound needs the reference's magnitude row (its elements are sums of
// products whose terms are not all in the trace).
bool bound_needs_magnitude(Stage s);

// The norms' row scale (see above): the common relative error of a row, delta = sum e_i y_i /
// sum y_i^2, is held to shared + 1.5 lambda sqrt(sum y_i^2 b_i^2 / 3) / sum y_i^2, b_i the part of
// each element's bound its own roundings make (`element`). Only for attn_norm, ffn_norm and
// final_norm (nullopt otherwise).
struct RowScaleBound {
  double shared = 0;             // r's relative error bound
  std::vector<double> element;  // per element, the bound of its independent roundings
};
std::optional<RowScaleBound> row_scale_bound(const Config& c, Stage s, int layer,
                                             BoundSource& source, const PrecisionPolicy& policy,
                                             const BoundOptions& options);

// Whether the stage only copies stored values (embedding, v): its bound is one rounding to the
// storage precision, which a correct copy may use up to all of, so it says nothing about
// headroom.
bool bound_is_rounding(Stage s);

// The bound's formula, one line, for reports and the README.
std::string_view bound_formula(Stage s);

}  // namespace parity
