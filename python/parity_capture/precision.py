"""Precision declarations of ports: how a port rounds, stage by stage, as the numbers the
float64 reference derives each stage's error bound from. The Python twin of model/precision.h:
the same fields, the same presets (tests/python_capture_test.py compares the two tables).

A declaration has one set of unit roundoffs for every stage and, per stage, the fields where that
stage differs:

    storage_unit_roundoff       u_s  the format of the stage's stored output (and of stored inputs)
    accumulation_unit_roundoff  u_a  sums (dot products, softmax denominators, mean squares) and
                                     the arithmetic of elementary functions
    intermediate_unit_roundoff  u_e  results the stage materializes between its operations: RoPE's
                                     cos/sin tables and products, the scaled scores, the softmax's
                                     subtraction of the maximum, SwiGLU's factors, the products of
                                     the routed sum (an eager PyTorch port rounds each to its dtype)
    operand_unit_roundoff       u_o  stored inputs rounded to this before the arithmetic (a
                                     BF16-operand GEMM over float32 activations); 0: used as stored
    bias_unit_roundoff          u_b  a projection's sum rounded before its bias is added
                                     (`x @ W + b` as two operations); 0: the bias is in the sum
    function_ulps               F    exp, sin, cos, sqrt, division within F u_a
    storage_min_normal               below it a correct port may flush to zero

Presets (`Capture(..., precision=NAME)`):

    float64, float32         every stage in that format
    bfloat16, float16        stored in that format, computed in float32 inside each stage (fused
                             kernels: what vLLM-, SGLang-, TensorRT-LLM-like engines and most hand
                             ports run)
    vllm-like                bfloat16 activations, W4A16 experts, float32 accumulation; the
                             RMSNorm rounds the normalized value to bfloat16 before the weight,
                             RoPE computes in bfloat16 on bfloat16 cos/sin (vLLM's kernels)
    bf16-operands            float32 activations and accumulation; the projections, the experts,
                             lm_head and attention's two products (q.k, and the probabilities
                             times v) round their inputs once to bfloat16 as the tensor cores'
                             operands (the device engine's bf16 precision)
    transformers-f64/-f32/-bf16/-f16
                             Hugging Face transformers' GptOss in eager mode in that dtype: every
                             intermediate tensor rounded to the dtype, RMSNorm and the router's
                             softmax in float32, the experts' `x @ W + b` rounded before the bias,
                             the routed sum accumulated in the dtype (index_add_); in float64 its
                             RMSNorm and RoPE still run in float32 (transformers 5.17)
"""

from __future__ import annotations

import math

__all__ = ["FIELDS", "PRESETS", "policy", "preset_names", "storage_name"]

F64, F32, F16, BF16 = 2.0 ** -53, 2.0 ** -24, 2.0 ** -11, 2.0 ** -8
FIELDS = ("storage_unit_roundoff", "accumulation_unit_roundoff", "intermediate_unit_roundoff",
          "operand_unit_roundoff", "bias_unit_roundoff", "function_ulps", "storage_min_normal")

_NORMS = ("attn_norm", "ffn_norm", "final_norm")


def _base(storage, accumulation, intermediate, ulps, min_normal):
    return {"storage_unit_roundoff": storage, "accumulation_unit_roundoff": accumulation,
            "intermediate_unit_roundoff": intermediate, "operand_unit_roundoff": 0.0,
            "bias_unit_roundoff": 0.0, "function_ulps": ulps, "storage_min_normal": min_normal}


def _transformers(unit, min_normal):
    """transformers' GptOss, eager, every weight and activation in one dtype of unit roundoff
    `unit` (modeling_gpt_oss.py): each op's result is a tensor of that dtype."""
    stages = {n: {"intermediate_unit_roundoff": F32} for n in _NORMS}  # .to(float32) inside
    stages["topk_w"] = {"intermediate_unit_roundoff": F32}  # softmax accumulates in float32
    for n in ("mlp1", "mlp2"):  # x @ W, then + b
        stages[n] = {"bias_unit_roundoff": unit}
    # out * routing weight, index_add_ into a tensor of the dtype: the k terms summed in the dtype
    stages["moe_out"] = {"accumulation_unit_roundoff": unit}
    if unit < F32:  # float64: RMSNorm and the rotary tables still run in float32
        for n in _NORMS:
            stages[n] = {"operand_unit_roundoff": F32, "accumulation_unit_roundoff": F32,
                         "intermediate_unit_roundoff": F32, "function_ulps": 4.0}
        for n in ("q_rope", "k_rope"):
            stages[n] = {"accumulation_unit_roundoff": F32, "function_ulps": 4.0}
        return dict(_base(unit, unit, unit, 2.0, 2.0 ** -1022), stages=stages)
    return dict(_base(unit, F32, unit, 4.0, min_normal), stages=stages)


PRESETS = {
    "float64": _base(F64, F64, F64, 2.0, 2.0 ** -1022),
    "float32": _base(F32, F32, F32, 4.0, 2.0 ** -126),
    "bfloat16": _base(BF16, F32, F32, 4.0, 2.0 ** -126),
    "float16": _base(F16, F32, F32, 4.0, 2.0 ** -14),
    "vllm-like": dict(_base(BF16, F32, F32, 4.0, 2.0 ** -126), stages=dict(
        {n: {"intermediate_unit_roundoff": BF16} for n in _NORMS},
        q_rope={"intermediate_unit_roundoff": BF16}, k_rope={"intermediate_unit_roundoff": BF16})),
    "bf16-operands": dict(_base(F32, F32, F32, 4.0, 2.0 ** -126), stages={
        n: {"operand_unit_roundoff": BF16}
        for n in ("qkv", "scores", "attn_out", "o_proj", "mlp1", "mlp2", "logits")}),
    "transformers-f64": _transformers(F64, 2.0 ** -1022),
    "transformers-f32": _transformers(F32, 2.0 ** -126),
    "transformers-bf16": _transformers(BF16, 2.0 ** -126),
    "transformers-f16": _transformers(F16, 2.0 ** -14),
}


def preset_names() -> list:
    return list(PRESETS)


def policy(name: str) -> dict:
    """The precision policy of a preset, as the trace's precision_policy attribute holds it; a
    name that is not a preset raises CaptureError."""
    if not isinstance(name, str) or name not in PRESETS:
        from . import CaptureError, _quoted  # the package imports this module first
        raise CaptureError(f"precision {_quoted(name)} is not a preset ({', '.join(PRESETS)})")
    p = PRESETS[name]
    out = {"name": name}
    out.update({k: p[k] for k in FIELDS})
    if p.get("stages"):
        out["stages"] = {s: dict(v) for s, v in p["stages"].items()}
    return out


def storage_name(unit: float) -> str:
    """The storage format a unit roundoff names, or "" for none of the four."""
    for name, u in (("float64", F64), ("float32", F32), ("float16", F16), ("bfloat16", BF16)):
        if math.isclose(unit, u, rel_tol=0, abs_tol=0):
            return name
    return ""
