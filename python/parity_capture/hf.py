"""Capture Hugging Face transformers' own GptOss forward pass as a candidate trace:

    python -m parity_capture.hf MODEL_DIR --tokens 1,2,3 --out hf.h5 [--dtype float32]
    parity-trace --model MODEL_DIR --candidate-trace hf.h5 --out out/hf

Forward hooks on transformers' GptOss modules map its tensors to the stage list; nothing of the
model is changed, and torch and transformers are imported only when this runs. The prompt runs as
one forward pass (no cache), with the eager attention implementation (the one whose attention
weights exist). Where transformers' modules produce a stage:

    embedding     model.embed_tokens output
    attn_norm     layers[L].input_layernorm output
    qkv           self_attn.q_proj, k_proj, v_proj outputs (the three parts of qkv)
    q_rope/k_rope apply_rotary_pos_emb's outputs (module function, wrapped while the pass runs)
    v             v_proj output
    att           eager_attention_forward's attention weights: transformers drops the sink's
                  column, so it is recorded with NO_SINK (its share is 1 - the keys' sum)
    attn_out      o_proj input; o_proj its output
    resid_attn    post_attention_layernorm input; ffn_norm its output
    router        mlp.router: the router logits it returns (or, in versions that return only the
                  scattered scores and indices, F.linear of its input with its own weight and bias)
    topk_idx/_w   the router's indices and their routing weights
    mlp1/swiglu/mlp2  per selected expert, from the experts module's own parameters with
                  transformers' expression (its batched forward does not expose per-expert
                  intermediates); skipped for quantized expert kernels
    moe_out       mlp output; resid_ffn the decoder layer's output
    final_norm    model.norm output; logits lm_head output; sampled their argmax

Not captured (listed so by parity-trace): scores (transformers computes the scaled logits inside
its attention function and keeps no handle on them).
"""

from __future__ import annotations

import argparse
import sys

from . import NO_SINK, QKV_K, QKV_Q, QKV_V, Capture, CaptureError


def _first(x):
    return x[0] if isinstance(x, (tuple, list)) else x


class _Hooks:
    """The hooks of one capture: every recorded row of the single forward pass over the prompt."""

    def __init__(self, model, cap: Capture):
        import torch
        import torch.nn.functional as F
        from transformers.models.gpt_oss import modeling_gpt_oss as mg

        self.torch, self.F, self.mg = torch, F, mg
        self.model, self.cap = model, cap
        self.handles = []
        self.layer = None  # the layer whose attention runs now
        self.skipped = set()
        self.routing = {}  # layer -> (indices [S, k], ffn_norm [S, H])
        self._originals = {}

    # -- recording ---------------------------------------------------------------------------

    def rows(self, stage, layer, t, layout=0, batched=True):
        """Records t[p] for every position p: t is [1, S, ...] (batched) or [S, ...]."""
        t = t.detach()
        if batched:
            t = t[0]
        for p in range(len(self.cap.tokens)):
            self.cap.record(stage, p, layer, t[p], layout=layout)

    def hook(self, module, fn, pre=False):
        # A hook that returns something replaces the module's input or output: these observe.
        def observe(*args):
            fn(*args)

        if pre:
            self.handles.append(module.register_forward_pre_hook(observe))
        else:
            self.handles.append(module.register_forward_hook(observe))

    # -- install -----------------------------------------------------------------------------

    def install(self):
        m = self.model.model
        self.hook(m.embed_tokens, lambda mod, i, o: self.rows("embedding", -1, o))
        for L, layer in enumerate(m.layers):
            attn, mlp = layer.self_attn, layer.mlp
            self.hook(layer.input_layernorm, lambda mod, i, o, L=L: self.rows("attn_norm", L, o))
            self.hook(attn.q_proj, lambda mod, i, o, L=L: self.rows("qkv", L, o, QKV_Q))
            self.hook(attn.k_proj, lambda mod, i, o, L=L: self.rows("qkv", L, o, QKV_K))
            self.hook(attn.v_proj, lambda mod, i, o, L=L: (self.rows("qkv", L, o, QKV_V), self.rows("v", L, o)))
            self.hook(attn, lambda mod, i, L=L: setattr(self, "layer", L), pre=True)
            self.hook(attn.o_proj, lambda mod, i, L=L: self.rows("attn_out", L, i[0]), pre=True)
            self.hook(attn.o_proj, lambda mod, i, o, L=L: self.rows("o_proj", L, o))
            self.hook(layer.post_attention_layernorm, lambda mod, i, L=L: self.rows("resid_attn", L, i[0]), pre=True)
            self.hook(layer.post_attention_layernorm, lambda mod, i, o, L=L: self.ffn_norm(L, o))
            self.hook(mlp.router, lambda mod, i, o, L=L: self.router(L, mod, i[0], o))
            self.hook(mlp, lambda mod, i, o, L=L: self.moe(L, mod, o))
            self.hook(layer, lambda mod, i, o, L=L: self.rows("resid_ffn", L, _first(o)))
        self.hook(m.norm, lambda mod, i, o: self.rows("final_norm", -1, o))
        self.hook(self.model.lm_head, lambda mod, i, o: self.logits(o))
        # The two module functions the attention calls by name: wrapped for the pass.
        self._originals = {"apply_rotary_pos_emb": self.mg.apply_rotary_pos_emb,
                           "eager_attention_forward": self.mg.eager_attention_forward}
        rope, eager = self._originals["apply_rotary_pos_emb"], self._originals["eager_attention_forward"]

        def rope_wrapper(q, k, *args, **kwargs):
            q_embed, k_embed = rope(q, k, *args, **kwargs)
            # [batch, heads, S, d] -> [S, heads, d]
            self.rows("q_rope", self.layer, q_embed[0].transpose(0, 1), batched=False)
            self.rows("k_rope", self.layer, k_embed[0].transpose(0, 1), batched=False)
            return q_embed, k_embed

        def eager_wrapper(module, query, key, value, attention_mask, *args, **kwargs):
            out, weights = eager(module, query, key, value, attention_mask, *args, **kwargs)
            w = weights.detach()[0]  # [heads, S, keys]
            for p in range(len(self.cap.tokens)):
                self.cap.record("att", p, module.layer_idx, w[:, p, : p + 1], layout=NO_SINK)
            return out, weights

        self.mg.apply_rotary_pos_emb = rope_wrapper
        self.mg.eager_attention_forward = eager_wrapper

    def remove(self):
        for h in self.handles:
            h.remove()
        self.handles.clear()
        for name, fn in self._originals.items():
            setattr(self.mg, name, fn)
        self._originals = {}

    # -- stages that need more than one tensor -----------------------------------------------

    def ffn_norm(self, L, out):
        self.rows("ffn_norm", L, out)
        self.routing.setdefault(L, [None, None])[1] = out.detach().reshape(-1, out.shape[-1])

    def router(self, L, module, x, out):
        torch = self.torch
        outs = out if isinstance(out, (tuple, list)) else (out,)
        indices = outs[-1]
        k = indices.shape[-1]
        if len(outs) >= 3:  # (router_logits, router_scores, router_indices)
            logits, scores = outs[0], outs[1]
        else:  # (router_scores scattered over the experts, router_indices)
            logits = self.F.linear(x.reshape(-1, module.weight.shape[1]), module.weight, module.bias)
            scores = outs[0]
        weights = scores if scores.shape[-1] == k else torch.gather(scores, -1, indices)
        self.rows("router", L, logits.reshape(-1, logits.shape[-1]), batched=False)
        self.rows("topk_idx", L, indices.reshape(-1, k).to(torch.int64), batched=False)
        self.rows("topk_w", L, weights.reshape(-1, k), batched=False)
        self.routing.setdefault(L, [None, None])[0] = indices.reshape(-1, k)

    def moe(self, L, mlp, out):
        self.rows("moe_out", L, _first(out))
        experts = mlp.experts
        if not hasattr(experts, "gate_up_proj") or not hasattr(experts, "down_proj"):
            self.skipped.add("mlp1, swiglu, mlp2 (quantized expert kernels)")
            return
        torch = self.torch
        indices, x = self.routing[L]
        limit = getattr(experts, "limit", 7.0)
        alpha = getattr(experts, "alpha", 1.702)
        with torch.no_grad():
            for p in range(len(self.cap.tokens)):
                for slot in range(indices.shape[-1]):
                    e = int(indices[p, slot])
                    # transformers' GptOssExperts.forward, for one token and one expert
                    gate_up = x[p] @ experts.gate_up_proj[e] + experts.gate_up_proj_bias[e]
                    gate, up = gate_up[..., ::2], gate_up[..., 1::2]
                    gate = gate.clamp(min=None, max=limit)
                    up = up.clamp(min=-limit, max=limit)
                    glu = gate * torch.sigmoid(gate * alpha)
                    act = (up + 1) * glu
                    y = act @ experts.down_proj[e] + experts.down_proj_bias[e]
                    self.cap.record("mlp1", p, L, gate_up, slot=slot)
                    self.cap.record("swiglu", p, L, act, slot=slot)
                    self.cap.record("mlp2", p, L, y, slot=slot)

    def logits(self, out):
        self.rows("logits", -1, out)
        best = out.detach()[0].argmax(dim=-1)
        for p in range(len(self.cap.tokens)):
            self.cap.record("sampled", p, -1, best[p : p + 1].to(self.torch.int64))


def load_model(model_dir: str, dtype: str, device: str):
    """transformers' GptOssForCausalLM from a checkpoint directory, eager attention, eager experts
    (the per-expert loop: the grouped-GEMM path takes no float64), MXFP4 experts dequantized (no
    kernels needed) and then held in `dtype` like every other weight (dequantization gives
    bfloat16, exactly representable in float32 and float64)."""
    import torch
    from transformers import AutoModelForCausalLM

    kwargs = {"attn_implementation": "eager"}
    try:
        from transformers import Mxfp4Config
        import json
        import os
        with open(os.path.join(model_dir, "config.json"), encoding="utf-8") as f:
            quant = json.load(f).get("quantization_config", {})
        if quant.get("quant_method") == "mxfp4":
            kwargs["quantization_config"] = Mxfp4Config(dequantize=True)
    except ImportError:
        pass
    torch_dtype = getattr(torch, dtype)
    try:
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch_dtype,
                                                     experts_implementation="eager", **kwargs)
    except TypeError:  # transformers before `dtype` and `experts_implementation`
        model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch_dtype, **kwargs)
    return model.to(device=device, dtype=torch_dtype).eval()


def capture_transformers(model, model_dir: str, tokens, out: str, port: str = "transformers",
                         precision: str = "float32") -> set:
    """Runs the prompt through `model` (a GptOssForCausalLM) once and writes its capture to `out`.
    Returns what it could not capture (besides scores)."""
    import torch

    if getattr(model.config, "_attn_implementation", "eager") != "eager":
        raise CaptureError(f"capture {out}: load the model with attn_implementation=\"eager\" (the "
                           "attention weights exist only there)")
    with Capture(out, model_dir, tokens, port=port, precision=precision,
                 device=f"transformers on {next(model.parameters()).device}") as cap:
        hooks = _Hooks(model, cap)
        hooks.install()
        try:
            ids = torch.tensor([list(tokens)], dtype=torch.long, device=next(model.parameters()).device)
            with torch.no_grad():
                model(input_ids=ids, use_cache=False)
        finally:
            hooks.remove()
    return hooks.skipped


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m parity_capture.hf",
        description="Capture transformers' GptOss forward pass as a candidate trace for "
                    "`parity-trace --candidate-trace`.")
    ap.add_argument("model_dir", help="a Hugging Face gpt-oss checkpoint directory")
    ap.add_argument("--tokens", required=True, help="comma-separated token ids at positions 0, 1, ...")
    ap.add_argument("--out", required=True, help="the capture file to write")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16", "float64"],
                    help="the dtype transformers runs in (default float32)")
    ap.add_argument("--device", default="cpu", help="torch device (default cpu)")
    ap.add_argument("--port", default="transformers", help="the name recorded as the trace's backend")
    args = ap.parse_args(argv)
    try:
        tokens = [int(t) for t in args.tokens.split(",")]
    except ValueError:
        print(f"parity_capture.hf: error: --tokens {args.tokens!r}: comma-separated integers", file=sys.stderr)
        return 2
    try:  # the tokens, before the model is loaded
        import json
        import os
        from . import _Config
        with open(os.path.join(args.model_dir, "config.json"), encoding="utf-8") as f:
            vocab = _Config(json.load(f), args.model_dir).vocab
        bad = [(i, t) for i, t in enumerate(tokens) if not 0 <= t < vocab]
        if bad:
            raise CaptureError(f"token id {bad[0][1]} at position {bad[0][0]} is out of range for "
                               f"{args.model_dir} (vocabulary 0..{vocab - 1})")
    except (OSError, ValueError) as e:
        print(f"parity_capture.hf: error: {e}", file=sys.stderr)
        return 2
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as e:
        print(f"parity_capture.hf: error: needs torch and transformers ({e})", file=sys.stderr)
        return 2
    try:
        model = load_model(args.model_dir, args.dtype, args.device)
        skipped = capture_transformers(model, args.model_dir, tokens, args.out, args.port, args.dtype)
    except CaptureError as e:
        print(f"parity_capture.hf: error: {e}", file=sys.stderr)
        return 2
    print(f"parity_capture.hf: wrote {args.out} ({len(tokens)} tokens; not captured: scores"
          + "".join(f", {s}" for s in sorted(skipped)) + ")")
    return 0


if __name__ == "__main__":
    sys.exit(main())
