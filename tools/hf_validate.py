#!/usr/bin/env python3
"""Validation data from the official implementation (transformers' GptOss), in true float64.

Builds a small random GptOss model with transformers, rounds every weight to BF16, saves it
with save_pretrained (the dequantized layout: experts gate_up_proj [E, H, 2I] and down_proj
[E, I, H], input-major; config.json with transformers 5's rope_parameters), then runs it in
float64 (eager attention, eager experts) over a token sequence longer than its sliding window
and writes expected.safetensors with:
  tokens          I32 [T]
  logits          F64 [T, V]
  hidden.<l>      F64 [T, H]   output of decoder layer l (resid_ffn in our stage names)
  final_norm      F64 [T, H]

Two initialisations (--init):
  unit   activations O(1): norm weights near 1, biases std 0.1, sinks N(0, 1); 24 tokens.
  large  magnitudes like a real checkpoint's: norm weights near 2 (a few near 4), biases std
         0.4, sinks N(1, 1); 40 tokens (five sliding windows).

Float64 patch. Even when the model is float64, transformers computes the rotary embedding in
float32 (GptOssRotaryEmbedding: inv_freq is a float32 buffer made at init, and forward disables
autocast and calls .float() on inv_freq and position_ids before the angles, cos and sin) and
RMSNorm in float32 (GptOssRMSNorm.forward casts its input to float32). Our reference computes
both in double, so unpatched transformers differs from it by about 1e-7..1e-6 relative, more
at later positions and with larger activations. Before the float64 forward this script
therefore replaces, on the classes of the loaded model:
  GptOssRotaryEmbedding.forward  angles = position * inv_freq, cos/sin times attention_scaling,
                                 all float64; the inv_freq and original_inv_freq buffers are
                                 replaced by the config's YaRN inverse frequencies computed in
                                 float64 with transformers' _compute_yarn_parameters formula
                                 (bounds without floor/ceil when truncate is false, linear ramp,
                                 blend; attention_scaling = 0.1 ln(factor) + 1).
  GptOssRMSNorm.forward          x * rsqrt(mean(x^2) + eps) * weight, float64.
and proves the patch took effect: a self-check compares the patched modules against a direct
float64 formula (pure Python math) before the run, and hooks compare every rotary and norm
call of the run itself; any difference above a few ulps, any float32 output, an unknown
rotary or norm class, or a config outside what the formula covers raises. A transformers
upgrade that renames or restructures these therefore fails here instead of writing float32
data. The README written next to the data records the command, the versions and the patch.

Run where torch and transformers are installed:
  python3 tools/hf_validate.py --out golden/hf-tiny
  python3 tools/hf_validate.py --init large --out golden/hf-large
tests/hf_validation_test.cpp checks the float64 reference against every golden/hf-* directory.
"""
import argparse
import json
import math
import os
import platform
import shlex
import shutil
import sys
import tempfile

import safetensors
import torch
import transformers
from safetensors.torch import save_file
from transformers import GptOssConfig, GptOssForCausalLM

ROTARY_CLASS = "GptOssRotaryEmbedding"
NORM_CLASS = "GptOssRMSNorm"
# cos/sin against math.cos/math.sin: the angles are the same products, and each library's cos
# and sin is within an ulp, so the patched values agree to a few 1e-16 of the largest.
ROTARY_RTOL = 1e-15
# The norm's mean and rsqrt round differently from the fsum and 1/sqrt of the direct formula:
# a few ulps. float32 arithmetic would show 1e-8 or more.
NORM_RTOL = 1e-14
# A float32 inv_freq from transformers' own formula agrees with ours to float32 rounding; a
# different formula (truncate misread, other bounds) differs by percents.
INV_FREQ_FLOAT32_RTOL = 1e-5


def max_rel(got, want):
    """max |got - want| / max |want|, the measure the C++ test reports."""
    scale = want.abs().max().item()
    err = (got.to(torch.float64) - want).abs().max().item()
    return err / scale if scale > 0 else err


# ---------------------------------------------------------------------------------------------
# Model


def build(seed: int, init: str):
    layers = 4
    cfg = GptOssConfig(
        vocab_size=512, hidden_size=64, intermediate_size=64, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_local_experts=8,
        num_experts_per_tok=4, sliding_window=8,
        rms_norm_eps=1e-5, swiglu_limit=7.0, attention_bias=True, tie_word_embeddings=False,
        layer_types=["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(layers)],
    )  # RoPE left at the class defaults: gpt-oss YaRN (theta 150000, factor 32, beta 32/1)
    cfg._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = GptOssForCausalLM(cfg).eval()
    g = torch.Generator().manual_seed(seed)

    def randn(shape, std):
        return torch.randn(shape, generator=g, dtype=torch.float64) * std

    # Scales so activations stay O(1), the SwiGLU clamp engages and routing spreads; the
    # default init (std 0.02) would leave every branch cold. One draw per parameter in
    # named_parameters order: the unit model is the same for a given seed as it always was.
    def unit(name, p):
        if name.endswith("layernorm.weight") or name == "model.norm.weight":
            return 1 + randn(p.shape, 0.1)
        if name.endswith("sinks"):
            return randn(p.shape, 1.0)
        if name.endswith("experts.gate_up_proj"):   # [E, H, 2I], input-major
            return randn(p.shape, 3.0 / p.shape[1] ** 0.5)
        if name.endswith("experts.down_proj"):      # [E, I, H]
            return randn(p.shape, 0.3 / p.shape[1] ** 0.5)
        if name.endswith("bias"):
            return randn(p.shape, 0.1)
        if name == "model.embed_tokens.weight":
            return randn(p.shape, 1.0)
        if p.dim() == 2:                            # [out, in]
            return randn(p.shape, 1.0 / p.shape[1] ** 0.5)
        raise RuntimeError(f"unexpected parameter {name} {tuple(p.shape)}")

    # Real checkpoints have norm gains well above 1, biases of a few tenths and positive sinks,
    # so normalised activations, q.k scores and residuals are several times those of `unit`:
    # where float32 RoPE/RMSNorm errors grow, and where a float64 comparison must still hold.
    def large(name, p):
        if name.endswith("layernorm.weight") or name == "model.norm.weight":
            # Gains 2 +- 0.5, kept positive, and 1 in 32 doubled (about 4), as real
            # checkpoints have a few channels with much larger gains.
            v = (2 + randn(p.shape, 0.5)).clamp(min=0.25)
            v[torch.randperm(v.numel(), generator=g)[:max(1, v.numel() // 32)]] *= 2
            return v
        if name.endswith("sinks"):
            return 1 + randn(p.shape, 1.0)          # N(1, 1): sinks take a real share
        if name.endswith("experts.gate_up_proj"):
            # Inputs are ~2x those of `unit` (gains ~2), so 2/sqrt(H) rather than 3/sqrt(H)
            # keeps the clamp engaging without saturating: with seed 1234, 5.4 % of gates exceed
            # 7 and 10.6 % of |up| do (3/sqrt(H): about 13 % and 27 % in a Python replica).
            return randn(p.shape, 2.0 / p.shape[1] ** 0.5)
        if name.endswith("experts.down_proj"):
            return randn(p.shape, 0.3 / p.shape[1] ** 0.5)
        if name.endswith("bias"):
            return randn(p.shape, 0.4)              # q/k/v/o, router and expert biases
        if name == "model.embed_tokens.weight":
            return randn(p.shape, 1.0)
        if p.dim() == 2:
            return randn(p.shape, 1.0 / p.shape[1] ** 0.5)
        raise RuntimeError(f"unexpected parameter {name} {tuple(p.shape)}")

    draw = {"unit": unit, "large": large}[init]
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(draw(name, p).to(torch.bfloat16).to(p.dtype))   # exactly representable in BF16
    return cfg, model


# ---------------------------------------------------------------------------------------------
# Float64 RoPE (YaRN) and RMSNorm


def yarn_float64(config):
    """transformers' _compute_yarn_parameters (modeling_rope_utils.py), every step in double.

    Returns (inv_freq as Python floats, attention_scaling). Raises for any parameter the
    gpt-oss formula below does not cover, rather than computing something else.
    """
    rp = getattr(config, "rope_parameters", None)
    if not isinstance(rp, dict) or "rope_type" not in rp:
        raise RuntimeError(f"config.rope_parameters is {rp!r}: expected transformers 5's dict with rope_type")
    if rp["rope_type"] != "yarn":
        raise RuntimeError(f"rope_type {rp['rope_type']!r}: this script computes gpt-oss YaRN only")
    for key in ("attention_factor", "mscale", "mscale_all_dim"):
        if rp.get(key) is not None:
            raise RuntimeError(f"rope_parameters[{key!r}] = {rp[key]!r}: not part of gpt-oss YaRN")
    partial = rp.get("partial_rotary_factor", getattr(config, "partial_rotary_factor", 1.0))
    if partial not in (None, 1.0):
        raise RuntimeError(f"partial_rotary_factor {partial}: gpt-oss rotates the whole head")
    base = float(rp["rope_theta"])
    dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    original = rp["original_max_position_embeddings"]
    factor = rp.get("factor")
    if factor is None:
        factor = config.max_position_embeddings / original
    factor = float(factor)
    beta_fast = float(rp.get("beta_fast") or 32)
    beta_slow = float(rp.get("beta_slow") or 1)
    truncate = rp.get("truncate", True)   # transformers' default when the key is absent

    def correction_dim(rotations):
        return (dim * math.log(original / (rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    inv_freq = []
    for i in range(dim // 2):
        pos_freq = base ** ((2 * i) / dim)
        extrapolation = 1.0 / pos_freq
        interpolation = 1.0 / (factor * pos_freq)
        ramp = min(max((i - low) / (high - low), 0.0), 1.0)
        extrapolation_factor = 1 - ramp
        inv_freq.append(interpolation * (1 - extrapolation_factor) + extrapolation * extrapolation_factor)
    scaling = 1.0 if factor <= 1 else 0.1 * math.log(factor) + 1.0
    return inv_freq, scaling


def rotary_direct(positions, inv_freq, scaling):
    """cos and sin [len(positions), len(inv_freq)] with Python's math (C double)."""
    cos = [[math.cos(float(p) * f) * scaling for f in inv_freq] for p in positions]
    sin = [[math.sin(float(p) * f) * scaling for f in inv_freq] for p in positions]
    return torch.tensor(cos, dtype=torch.float64), torch.tensor(sin, dtype=torch.float64)


def rmsnorm_direct(x, weight, eps):
    """x / sqrt(sum(x^2) / n + eps) * weight per row, with an exact sum (math.fsum)."""
    w = weight.detach().to(torch.float64).cpu().tolist()
    rows = x.detach().to(torch.float64).cpu().reshape(-1, x.shape[-1]).tolist()
    out = []
    for r in rows:
        inv = 1.0 / math.sqrt(math.fsum(v * v for v in r) / len(r) + eps)
        out.append([v * inv * wi for v, wi in zip(r, w)])
    return torch.tensor(out, dtype=torch.float64).reshape(x.shape)


@torch.no_grad()
def _rotary_forward_float64(self, x, position_ids, layer_type=None):
    # Replaces GptOssRotaryEmbedding.forward (and its dynamic_rope_update wrapper, a no-op for
    # yarn). Same output layout: cos, sin [batch, seq, head_dim / 2], no duplication.
    if layer_type is not None:
        raise RuntimeError(f"{type(self).__name__} called with layer_type={layer_type!r}: per-layer-type "
                           "RoPE is not what this patch was written against")
    if self.inv_freq.dtype != torch.float64:
        raise RuntimeError(f"{type(self).__name__}.inv_freq is {self.inv_freq.dtype}: the float64 buffer was replaced")
    if x.dtype != torch.float64:
        raise RuntimeError(f"{type(self).__name__} patched for a float64 run, called with {x.dtype}")
    device_type = x.device.type if isinstance(x.device.type, str) and x.device.type != "mps" else "cpu"
    with torch.autocast(device_type=device_type, enabled=False):
        angles = position_ids.to(device=x.device, dtype=torch.float64)[:, :, None] * self.inv_freq.to(x.device)[None, None, :]
        cos = angles.cos() * self.attention_scaling
        sin = angles.sin() * self.attention_scaling
    return cos, sin


def _rmsnorm_forward_float64(self, hidden_states):
    # Replaces GptOssRMSNorm.forward, which casts to float32; the weight may be kept in float32
    # (_keep_in_fp32_modules) and holds BF16 values, so the cast to float64 is exact.
    if hidden_states.dtype != torch.float64:
        raise RuntimeError(f"{type(self).__name__} patched for a float64 run, called with {hidden_states.dtype}")
    variance = hidden_states.pow(2).mean(-1, keepdim=True)
    return hidden_states * torch.rsqrt(variance + self.variance_epsilon) * self.weight.to(torch.float64)


def patch_float64(model, config, run_positions):
    """Patch RoPE and RMSNorm of `model` to float64; self-check; return facts for the README.

    run_positions: the positions of the run, where transformers' unpatched error is measured.
    """
    inv_freq, scaling = yarn_float64(config)
    rotaries, norms = [], []
    for name, m in model.named_modules():
        cls = type(m).__name__
        if cls == ROTARY_CLASS:
            rotaries.append((name, m))
        elif cls == NORM_CLASS:
            norms.append((name, m))
        elif "Rotary" in cls or "Norm" in cls:
            raise RuntimeError(f"{name}: unknown class {cls}, which may compute in float32; extend the patch")
    n_norms = 2 * config.num_hidden_layers + 1
    if len(rotaries) != 1 or len(norms) != n_norms:
        raise RuntimeError(f"found {len(rotaries)} {ROTARY_CLASS} and {len(norms)} {NORM_CLASS} modules, expected "
                           f"1 and {n_norms}: transformers' GptOss changed, re-read modeling_gpt_oss.py")
    H = config.hidden_size
    for name, m in norms:
        eps = getattr(m, "variance_epsilon", None)
        if eps != config.rms_norm_eps or tuple(m.weight.shape) != (H,):
            raise RuntimeError(f"{name}: variance_epsilon {eps} / weight {tuple(m.weight.shape)}, expected "
                               f"{config.rms_norm_eps} / ({H},)")
    for name, m in rotaries:
        for attr in ("inv_freq", "attention_scaling", "rope_type"):
            if not hasattr(m, attr):
                raise RuntimeError(f"{name} has no {attr}: transformers' {ROTARY_CLASS} changed")
        if m.rope_type != "yarn":
            raise RuntimeError(f"{name}.rope_type is {m.rope_type!r}, expected 'yarn'")
        if abs(m.attention_scaling - scaling) > 1e-15 * scaling:
            raise RuntimeError(f"{name}.attention_scaling {m.attention_scaling!r} != 0.1 ln(factor) + 1 = {scaling!r}")
        want = torch.tensor(inv_freq, dtype=torch.float64)
        if tuple(m.inv_freq.shape) != tuple(want.shape) or max_rel(m.inv_freq.cpu(), want) > INV_FREQ_FLOAT32_RTOL:
            raise RuntimeError(f"{name}.inv_freq {m.inv_freq.tolist()} is not the float64 YaRN {inv_freq}: "
                               "the formula here no longer matches transformers'")

    # Before patching: how far transformers' own float32 RoPE and RMSNorm are from float64.
    gen = torch.Generator().manual_seed(0)
    xn = torch.randn(2, 5, H, generator=gen, dtype=torch.float64) * 3
    with torch.no_grad():
        cos, sin = rotaries[0][1](torch.zeros(1, len(run_positions), H, dtype=torch.float64),
                                  torch.tensor([run_positions], dtype=torch.long))
        want_cos, want_sin = rotary_direct(run_positions, inv_freq, scaling)
        unpatched_rotary = max(max_rel(cos[0], want_cos), max_rel(sin[0], want_sin))
        unpatched_norm = max(max_rel(m(xn), rmsnorm_direct(xn, m.weight, m.variance_epsilon)) for _, m in norms)

    # The self-check's positions reach past the run's: window edges, the YaRN original context
    # and the largest position, where an angle computed in float32 would be off by radians.
    positions = [0, 1, 2, 7, 8, 23, 39, 127, 128, 4095, 4096, 131071]
    pid = torch.tensor([positions], dtype=torch.long)
    x = torch.zeros(1, len(positions), H, dtype=torch.float64)
    want_cos, want_sin = rotary_direct(positions, inv_freq, scaling)

    for cls in {type(m) for _, m in rotaries}:
        cls.forward = _rotary_forward_float64
    for cls in {type(m) for _, m in norms}:
        cls.forward = _rmsnorm_forward_float64
    for name, m in rotaries + norms:
        if "forward" in vars(m):
            raise RuntimeError(f"{name} has an instance-level forward that would bypass the class patch")
    for _, m in rotaries:
        f64 = torch.tensor(inv_freq, dtype=torch.float64, device=m.inv_freq.device)
        m.inv_freq = f64                    # a registered buffer: replaced in place of the float32 one
        m.original_inv_freq = f64.clone()   # what dynamic/longrope updates would restore
        if m.inv_freq.dtype != torch.float64 or m.original_inv_freq.dtype != torch.float64:
            raise RuntimeError("inv_freq buffers did not take the float64 tensors")

    # Self-check: the patched modules, called as the model calls them, against pure Python.
    with torch.no_grad():
        for name, m in rotaries:
            cos, sin = m(x, pid)
            if cos.dtype != torch.float64 or sin.dtype != torch.float64 or tuple(cos.shape) != (1, len(positions), len(inv_freq)):
                raise RuntimeError(f"patched {name} returned {cos.dtype} {tuple(cos.shape)}")
            rel = max(max_rel(cos[0], want_cos), max_rel(sin[0], want_sin))
            if rel > ROTARY_RTOL:
                raise RuntimeError(f"patched {name}: cos/sin differ from float64 math by {rel:.3e} relative (> {ROTARY_RTOL})")
        for name, m in norms:
            y = m(xn)
            rel = max_rel(y, rmsnorm_direct(xn, m.weight, m.variance_epsilon))
            if y.dtype != torch.float64 or rel > NORM_RTOL:
                raise RuntimeError(f"patched {name}: {y.dtype}, {rel:.3e} relative from the float64 formula (> {NORM_RTOL})")
    return {"inv_freq": inv_freq, "attention_scaling": scaling, "rotary": rotaries, "norms": norms,
            "unpatched_rotary_rel": unpatched_rotary, "unpatched_rmsnorm_rel": unpatched_norm}


def watch_patched(patch):
    """Hooks that check every rotary and norm call of the real run against the direct formula."""
    seen = {"rotary": 0, "norm": 0, "rotary_rel": 0.0, "norm_rel": 0.0}
    handles = []

    def on_rotary(module, args, kwargs, output):
        pid = kwargs["position_ids"] if "position_ids" in kwargs else args[1]
        cos, sin = output
        if cos.dtype != torch.float64 or sin.dtype != torch.float64:
            raise RuntimeError(f"rotary returned {cos.dtype} during the run")
        for b in range(pid.shape[0]):
            want_cos, want_sin = rotary_direct(pid[b].tolist(), patch["inv_freq"], patch["attention_scaling"])
            rel = max(max_rel(cos[b].cpu(), want_cos), max_rel(sin[b].cpu(), want_sin))
            seen["rotary_rel"] = max(seen["rotary_rel"], rel)
        seen["rotary"] += 1

    def on_norm(module, args, output):
        if output.dtype != torch.float64:
            raise RuntimeError(f"RMSNorm returned {output.dtype} during the run")
        rel = max_rel(output.cpu(), rmsnorm_direct(args[0], module.weight, module.variance_epsilon))
        seen["norm_rel"] = max(seen["norm_rel"], rel)
        seen["norm"] += 1

    for _, m in patch["rotary"]:
        handles.append(m.register_forward_hook(on_rotary, with_kwargs=True))
    for _, m in patch["norms"]:
        handles.append(m.register_forward_hook(on_norm))

    def verify():
        for h in handles:
            h.remove()
        if seen["rotary"] != len(patch["rotary"]) or seen["norm"] != len(patch["norms"]):
            raise RuntimeError(f"the run called the rotary {seen['rotary']} times and the norms {seen['norm']} times, "
                               f"expected {len(patch['rotary'])} and {len(patch['norms'])}: the patch did not cover it")
        if seen["rotary_rel"] > ROTARY_RTOL or seen["norm_rel"] > NORM_RTOL:
            raise RuntimeError(f"during the run rotary {seen['rotary_rel']:.3e} / norm {seen['norm_rel']:.3e} relative "
                               "from the float64 formula")
        return seen

    return verify


def mlp_stats(model, config, mlp_inputs):
    """Clamp engagement, expert use and the smallest top-k routing margin of the run."""
    limit = config.swiglu_limit
    k = config.num_experts_per_tok
    hits = [0] * config.num_local_experts
    gate_clamped = up_clamped = total = 0
    min_margin = math.inf
    for i, layer in enumerate(model.model.layers):
        h = mlp_inputs[i].reshape(-1, config.hidden_size)
        router, experts = layer.mlp.router, layer.mlp.experts
        logits = torch.nn.functional.linear(h, router.weight, router.bias)
        top = torch.topk(logits, k + 1, dim=-1)
        min_margin = min(min_margin, (top.values[:, k - 1] - top.values[:, k]).min().item())
        for t in range(h.shape[0]):
            for e in top.indices[t, :k].tolist():
                hits[e] += 1
                gate_up = h[t] @ experts.gate_up_proj[e] + experts.gate_up_proj_bias[e]
                gate, up = gate_up[::2], gate_up[1::2]
                gate_clamped += int((gate > limit).sum())
                up_clamped += int((up.abs() > limit).sum())
                total += gate.numel()
    return {"gate_clamped": gate_clamped / total, "up_clamped": up_clamped / total,
            "expert_hits": hits, "min_topk_margin": min_margin}


# ---------------------------------------------------------------------------------------------


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--init", choices=("unit", "large"), default="unit")
    ap.add_argument("--tokens", type=int, default=None, help="sequence length (default 24 for unit, 40 for large)")
    args = ap.parse_args()
    n_tokens = args.tokens if args.tokens is not None else {"unit": 24, "large": 40}[args.init]

    cfg, model = build(args.seed, args.init)
    if n_tokens <= cfg.sliding_window:
        raise SystemExit(f"--tokens {n_tokens}: the sequence must be longer than the window ({cfg.sliding_window})")
    # Everything is written to a scratch directory next to --out and moved in only once the run
    # and its checks have passed, so a failure leaves no model without expected values.
    parent = os.path.dirname(os.path.abspath(args.out))
    os.makedirs(parent, exist_ok=True)
    work = tempfile.mkdtemp(prefix=".hf_validate.", dir=parent)
    try:
        run(args, n_tokens, cfg, model, work)
        os.makedirs(args.out, exist_ok=True)
        for f in sorted(os.listdir(work)):
            os.replace(os.path.join(work, f), os.path.join(args.out, f))
    finally:
        shutil.rmtree(work, ignore_errors=True)


def run(args, n_tokens, cfg, model, work):
    model.to(torch.bfloat16).save_pretrained(work, safe_serialization=True)

    # Eager attention and the eager (per-expert loop) experts: the fused grouped_mm path
    # refuses float64.
    m64 = GptOssForCausalLM.from_pretrained(work, dtype=torch.float64, attn_implementation="eager",
                                            experts_implementation="eager").eval()
    for name, p in m64.named_parameters():
        # Norm weights may stay float32 (_keep_in_fp32_modules); they hold BF16 values, exact there.
        if p.dtype not in (torch.float64, torch.float32):
            raise RuntimeError(f"{name} is {p.dtype} in the float64 model")
    patch = patch_float64(m64, m64.config, list(range(n_tokens)))
    verify = watch_patched(patch)

    tokens = torch.randint(0, cfg.vocab_size, (1, n_tokens), generator=torch.Generator().manual_seed(args.seed + 1))
    captured, mlp_inputs = {}, {}

    def hook(name):
        def f(_module, _inputs, output):
            out = output[0] if isinstance(output, tuple) else output
            if out.dtype != torch.float64:
                raise RuntimeError(f"{name} is {out.dtype} in the float64 run")
            captured[name] = out.detach()[0].clone()
        return f

    def mlp_hook(i):
        def f(_module, args, kwargs):
            mlp_inputs[i] = (args[0] if args else kwargs["hidden_states"]).detach().clone()
        return f

    for i, layer in enumerate(m64.model.layers):
        layer.register_forward_hook(hook(f"hidden.{i}"))
        layer.mlp.register_forward_pre_hook(mlp_hook(i), with_kwargs=True)
    m64.model.norm.register_forward_hook(hook("final_norm"))
    with torch.no_grad():
        out = m64(input_ids=tokens, use_cache=False)
        seen = verify()
        stats = mlp_stats(m64, cfg, mlp_inputs)
    if out.logits.dtype != torch.float64:
        raise RuntimeError(f"logits are {out.logits.dtype}")
    tensors = {"tokens": tokens[0].to(torch.int32).contiguous(), "logits": out.logits[0].contiguous()}
    tensors.update({k: v.contiguous() for k, v in captured.items()})

    command = shlex.join(["python3"] + sys.argv)
    versions = (f"Python {platform.python_version()}, torch {torch.__version__}, transformers {transformers.__version__}, "
                f"safetensors {safetensors.__version__}")
    save_file(tensors, os.path.join(work, "expected.safetensors"),
              metadata={"torch": torch.__version__, "transformers": transformers.__version__,
                        "seed": str(args.seed), "init": args.init, "tokens": str(n_tokens),
                        "rope_rmsnorm_dtype": "float64", "command": command, "generator": "tools/hf_validate.py"})
    name = os.path.basename(os.path.normpath(args.out))
    scales = {"unit": "norm weights 1 + N(0, 0.1), biases std 0.1, sinks N(0, 1), embeddings std 1, "
                      "expert gate_up std 3/sqrt(H)",
              "large": "norm weights 2 + N(0, 0.5) clipped at 0.25 with 1 in 32 doubled, biases std 0.4, "
                       "sinks N(1, 1), embeddings std 1, expert gate_up std 2/sqrt(H)"}[args.init]
    with open(os.path.join(work, "README.md"), "w") as f:
        f.write(f"# {name}: validation data from transformers' GptOss, float64\n\n"
                f"Written by `{command}` (init {args.init}, seed {args.seed}, {n_tokens} tokens)\n"
                f"with {versions}.\n\n"
                f"- model.safetensors + config.json: a random BF16 GptOss model as save_pretrained writes it "
                f"({scales}; sliding window {cfg.sliding_window}).\n"
                "- expected.safetensors: tokens, float64 logits, per-layer hidden states, final norm.\n\n"
                "The float64 run patches transformers, which computes RoPE and RMSNorm in float32 even in a float64 "
                "model: GptOssRotaryEmbedding.forward and its inv_freq buffers (YaRN inverse frequencies, angles, "
                "cos and sin in float64) and GptOssRMSNorm.forward (float64). Unpatched, transformers' own "
                f"rotary differs from float64 by {patch['unpatched_rotary_rel']:.2e} and its RMSNorm by "
                f"{patch['unpatched_rmsnorm_rel']:.2e} relative; patched, every rotary and norm call of the run agreed "
                f"with a direct float64 formula to {seen['rotary_rel']:.2e} and {seen['norm_rel']:.2e}.\n\n"
                f"SwiGLU clamp: {stats['gate_clamped']:.1%} of gates above {cfg.swiglu_limit}, {stats['up_clamped']:.1%} "
                f"of |up| above it; expert hits {stats['expert_hits']}; smallest top-{cfg.num_experts_per_tok} "
                f"router margin {stats['min_topk_margin']:.3e}.\n")
    print(json.dumps({"out": args.out, "init": args.init, "tokens": tokens[0].tolist(), "command": command,
                      "versions": versions,
                      "logits_absmax": float(out.logits.abs().max()),
                      "hidden_absmax": max(float(v.abs().max()) for k, v in captured.items() if k.startswith("hidden.")),
                      "unpatched_rotary_rel": patch["unpatched_rotary_rel"],
                      "unpatched_rmsnorm_rel": patch["unpatched_rmsnorm_rel"],
                      "run_rotary_rel": seen["rotary_rel"], "run_rmsnorm_rel": seen["norm_rel"],
                      **stats, "files": sorted(os.listdir(work))}))


if __name__ == "__main__":
    main()
