#!/usr/bin/env python3
"""Request files for serving benchmarks of `run` (JSON Lines, engine/requests.h).

Writes one request per line, {"prompt_token_ids": [...], "max_tokens": N, "ignore_eos": true}:
random prompt ids drawn uniformly from [0, --vocab) without the special tokens (--special), and
an output length that every request generates in full (ignore_eos, as vLLM's benchmark runs).
Seeded: the same options give the same file. Standard library only.

Mixes:
  sharegpt       lengths shaped like ShareGPT as vLLM's `benchmark_serving` samples it. This is a
                 fit to the published figures, not the dataset (nothing is downloaded): for 1,000
                 requests vLLM reports 217,396 prompt and 197,742 generated tokens (means 217.4
                 and 197.7), after its filter, which drops prompts under 4 or over 1,024 tokens,
                 outputs under 4 and prompt + output over 2,048. Here the prompt length is a
                 log-normal truncated to [4, 1024] and the output length, drawn independently, a
                 log-normal truncated to [4, 2048 - prompt]; their spreads (sigma 1.0 and 0.9 in
                 log space: medians about 60 % of the means, long right tails) are assumptions,
                 their locations are solved so that the truncated means are the published ones.
                 Draws are stratified (a Latin hypercube over the two quantiles), so the totals
                 of any seed stay within about a percent of the means times the count.
  prefill-heavy  4,000 prompt tokens, 200 generated (run it with --context 4200 or more: the
                 default context is 4,096 positions).
  decode-heavy   128 prompt tokens, 1,024 generated.

Usage: scripts/bench_requests.py --mix sharegpt [--count 1000] [--seed 0] [--vocab 201088]
           [--special 199998-201087] --out requests.jsonl
Prints one line: the mix, requests, prompt and output tokens, and the output share
(output / (prompt + output)).
"""
import argparse
import json
import math
import random
import sys
from statistics import NormalDist

# vLLM's benchmark_serving on ShareGPT (1,000 requests): 217,396 prompt and 197,742 generated.
SHAREGPT_MEAN_PROMPT = 217.396
SHAREGPT_MEAN_OUTPUT = 197.742
SHAREGPT_SIGMA_PROMPT = 1.0
SHAREGPT_SIGMA_OUTPUT = 0.9
# vLLM's filter (sample_sharegpt_requests).
MIN_LENGTH, MAX_PROMPT, MAX_TOTAL = 4, 1024, 2048

FIXED_MIXES = {"prefill-heavy": (4000, 200), "decode-heavy": (128, 1024)}
MIXES = ["sharegpt"] + sorted(FIXED_MIXES)

# o200k_harmony's special tokens: 199998 to 201087 (the 20b's and 120b's vocabulary is 201088).
DEFAULT_VOCAB = 201088
DEFAULT_SPECIAL = (199998, 201087)

N01 = NormalDist()


class TruncatedLogNormal:
    """A log-normal of log-location mu and log-scale sigma, truncated to [lo, hi]."""

    def __init__(self, mu, sigma, lo, hi):
        self.mu, self.sigma = mu, sigma
        self.a = N01.cdf((math.log(lo) - mu) / sigma)
        self.b = N01.cdf((math.log(hi) - mu) / sigma)
        self.lo, self.hi = lo, hi

    def mean(self):
        s = self.sigma
        upper = N01.cdf((math.log(self.hi) - self.mu - s * s) / s)
        lower = N01.cdf((math.log(self.lo) - self.mu - s * s) / s)
        return math.exp(self.mu + s * s / 2) * (upper - lower) / (self.b - self.a)

    def quantile(self, u):
        p = self.a + u * (self.b - self.a)
        p = min(max(p, 1e-15), 1 - 1e-15)
        x = math.exp(self.mu + self.sigma * N01.inv_cdf(p))
        return min(max(x, self.lo), self.hi)


def solve_mu(mean_of_mu, target):
    """The mu whose truncated mean is target (the mean grows with mu): bisection."""
    lo, hi = -5.0, 12.0
    for _ in range(100):
        mid = (lo + hi) / 2
        if mean_of_mu(mid) < target:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


# Prompt lengths at these quantiles stand for the prompt distribution where the output's bound
# (2048 - prompt) is averaged over it.
PROMPT_GRID = [(k + 0.5) / 400 for k in range(400)]


def sharegpt_fit():
    """The prompt distribution and the output's log-location, fitted to the published means."""
    mu_p = solve_mu(
        lambda mu: TruncatedLogNormal(mu, SHAREGPT_SIGMA_PROMPT, MIN_LENGTH, MAX_PROMPT).mean(),
        SHAREGPT_MEAN_PROMPT)
    prompt = TruncatedLogNormal(mu_p, SHAREGPT_SIGMA_PROMPT, MIN_LENGTH, MAX_PROMPT)
    prompts = [round(prompt.quantile(u)) for u in PROMPT_GRID]

    def output_mean(mu):
        return sum(TruncatedLogNormal(mu, SHAREGPT_SIGMA_OUTPUT, MIN_LENGTH, MAX_TOTAL - p).mean()
                   for p in prompts) / len(prompts)

    return prompt, solve_mu(output_mean, SHAREGPT_MEAN_OUTPUT)


def stratified(rng, n):
    """n uniforms in [0, 1), one in each of n equal strata, in random order."""
    strata = list(range(n))
    rng.shuffle(strata)
    return [(k + rng.random()) / n for k in strata]


def lengths(mix, count, rng):
    """(prompt, output) lengths of count requests."""
    if mix in FIXED_MIXES:
        return [FIXED_MIXES[mix]] * count
    prompt, mu_out = sharegpt_fit()
    pairs = []
    for u, v in zip(stratified(rng, count), stratified(rng, count)):
        p = round(prompt.quantile(u))
        out = TruncatedLogNormal(mu_out, SHAREGPT_SIGMA_OUTPUT, MIN_LENGTH, MAX_TOTAL - p)
        pairs.append((p, round(out.quantile(v))))
    return pairs


def parse_special(text):
    try:
        first, last = (int(x) for x in text.split("-"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: FIRST-LAST, two token ids")
    if first < 0 or last < first:
        raise argparse.ArgumentTypeError(f"{text!r}: FIRST-LAST with 0 <= FIRST <= LAST")
    return first, last


def positive(text):
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: a positive whole number")
    return n


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mix", required=True, choices=MIXES)
    ap.add_argument("--count", type=positive, default=1000, help="requests (default 1000)")
    ap.add_argument("--seed", type=int, default=0, help="the generator's seed (default 0)")
    ap.add_argument("--vocab", type=positive, default=DEFAULT_VOCAB,
                    help=f"prompt ids are below this (default {DEFAULT_VOCAB})")
    ap.add_argument("--special", type=parse_special, default=DEFAULT_SPECIAL,
                    help="FIRST-LAST: ids left out of prompts (default o200k_harmony's specials, "
                    f"{DEFAULT_SPECIAL[0]}-{DEFAULT_SPECIAL[1]})")
    ap.add_argument("--out", required=True, help="the .jsonl file to write")
    a = ap.parse_args(argv)

    first, last = a.special
    # Ids in [0, vocab) outside [first, last], as one range read through an offset.
    skipped = max(0, min(last + 1, a.vocab) - min(first, a.vocab))
    usable = a.vocab - skipped
    if usable < 1:
        ap.error(f"--vocab {a.vocab} with --special {first}-{last} leaves no id to draw")

    rng = random.Random(a.seed)
    pairs = lengths(a.mix, a.count, rng)
    with open(a.out, "w", encoding="ascii") as f:
        for prompt_len, output_len in pairs:
            ids = [rng.randrange(usable) for _ in range(prompt_len)]
            ids = [i + skipped if i >= first else i for i in ids]
            f.write(json.dumps({"prompt_token_ids": ids, "max_tokens": output_len,
                                "ignore_eos": True}, separators=(",", ":")) + "\n")
    prompt_tokens = sum(p for p, _ in pairs)
    output_tokens = sum(o for _, o in pairs)
    print(f"bench_requests: {a.mix}: {a.count} requests, {prompt_tokens} prompt tokens, "
          f"{output_tokens} output tokens, output share "
          f"{output_tokens / (prompt_tokens + output_tokens):.3f} (seed {a.seed}) -> {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
