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
    scores        eager_attention_forward's scaled logits, recomputed by the wrapper with the
                  function's own operations (matmul, * scaling, + the causal mask: the same
                  bits), the sink column from the module's sinks; masked keys hold the mask's
                  finfo.min, which the diff reads as masked
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

Every stage is captured, so parity-trace judges each by its local error (the reference recomputes
it from transformers' own inputs). The capture declares the precision preset of its dtype
(transformers-f64, -f32, -bf16, -f16: parity_capture/precision.py says what each declares).
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
            scaling = kwargs.get("scaling", args[0] if args else getattr(module, "scaling", None))
            self.scores(module, query, key, attention_mask, scaling)
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

    def scores(self, module, query, key, attention_mask, scaling):
        """eager_attention_forward's scaled logits, by its own operations in its order, with the
        sink appended as our last column."""
        torch = self.torch
        with torch.no_grad():
            key_states = self.mg.repeat_kv(key, module.num_key_value_groups)
            s = torch.matmul(query, key_states.transpose(2, 3)) * scaling
            if attention_mask is not None:
                s = s + attention_mask[:, :, :, : key_states.shape[-2]]
            s = s.detach()[0]  # [heads, S, keys]
            sinks = module.sinks.detach().reshape(-1, 1).to(s.dtype)
            for p in range(len(self.cap.tokens)):
                self.cap.record("scores", p, module.layer_idx, torch.cat([s[:, p, : p + 1], sinks], dim=1))

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

        def gate(gate_up):  # GptOssExperts._apply_gate
            if hasattr(experts, "_apply_gate"):
                return experts._apply_gate(gate_up)
            g, up = gate_up[..., ::2], gate_up[..., 1::2]
            g = g.clamp(min=None, max=limit)
            up = up.clamp(min=-limit, max=limit)
            return (up + 1) * (g * torch.sigmoid(g * alpha))

        # GptOssExperts.forward's own loop (transformers 5.17, eager experts): per expert hit, the
        # rows routed to it in one product, so each intermediate has the bits transformers' has.
        rows = {}
        with torch.no_grad():
            for e in torch.unique(indices).tolist():
                token_idx, slot_idx = torch.where(indices == e)
                gate_up = x[token_idx] @ experts.gate_up_proj[e] + experts.gate_up_proj_bias[e]
                act = gate(gate_up)
                y = act @ experts.down_proj[e] + experts.down_proj_bias[e]
                for i, (t, s) in enumerate(zip(token_idx.tolist(), slot_idx.tolist())):
                    rows[(t, s)] = (gate_up[i], act[i], y[i])
        for (p, slot), (gate_up, act, y) in sorted(rows.items()):
            self.cap.record("mlp1", p, L, gate_up, slot=slot)
            self.cap.record("swiglu", p, L, act, slot=slot)
            self.cap.record("mlp2", p, L, y, slot=slot)

    def logits(self, out):
        self.rows("logits", -1, out)
        best = out.detach()[0].argmax(dim=-1)
        for p in range(len(self.cap.tokens)):
            self.cap.record("sampled", p, -1, best[p : p + 1].to(self.torch.int64))


def _version(module: str) -> str:
    try:
        return __import__(module).__version__
    except (ImportError, AttributeError):
        return "?"


def load_model(model_dir: str, dtype: str, device: str, cast_buffers: bool = False):
    """transformers' GptOssForCausalLM from a checkpoint directory, eager attention, eager experts
    (the per-expert loop: the grouped-GEMM path takes no float64), MXFP4 experts dequantized (no
    kernels needed) and then held in `dtype` like every other weight (dequantization gives
    bfloat16, exactly representable in float32 and float64). Buffers keep the dtype transformers
    gives them (the rotary inv_freq stays float32) unless `cast_buffers`: then the whole model
    goes through model.to(dtype), as many scripts do, which rounds inv_freq to the dtype (RoPE's
    angles then err by a rounding of inv_freq times the position). `device` "auto" spreads the
    layers over every visible GPU in equal shares (device_map="balanced"), for a model one GPU
    cannot hold (the 20b in float64 is 168 GB, the 120b in bfloat16 234 GB)."""
    import torch
    from transformers import AutoModelForCausalLM

    kwargs = {"attn_implementation": "eager"}
    try:
        from transformers import Mxfp4Config
        import os
        from . import _read_json
        raw = _read_json(os.path.join(model_dir, "config.json"), "config")
        quant = raw.get("quantization_config") if isinstance(raw, dict) else None
        if isinstance(quant, dict) and quant.get("quant_method") == "mxfp4":
            kwargs["quantization_config"] = Mxfp4Config(dequantize=True)
    except ImportError:
        pass
    torch_dtype = getattr(torch, dtype)
    if device == "auto":
        # Each GPU gets an equal share of the model as the loader sizes it. Its sizes may be off
        # by a constant factor (the dequantized experts are sized as MXFP4, or as bfloat16 that
        # the cast below doubles or quadruples), but every layer is off alike: equal shares stay
        # equal, where "fill the first GPU first" would overfill it.
        if torch.cuda.device_count() == 0:
            raise CaptureError("--device auto: no GPU is visible")
        kwargs["device_map"] = "balanced"
    try:
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch_dtype,
                                                     experts_implementation="eager", **kwargs)
    except TypeError:  # transformers before `dtype` and `experts_implementation`
        model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch_dtype, **kwargs)
    if device != "auto":  # cast where the model will run
        model = model.to(device=device)
    if cast_buffers:
        return model.to(dtype=torch_dtype).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dtype != torch_dtype:
                p.data = p.data.to(torch_dtype)  # on the parameter's own device
    return model.eval()


# The precision preset of transformers in each dtype (parity_capture/precision.py).
PRECISION_OF_DTYPE = {"float64": "transformers-f64", "float32": "transformers-f32",
                      "bfloat16": "transformers-bf16", "float16": "transformers-f16"}


def capture_transformers(model, model_dir: str, tokens, out: str, port: str = "transformers",
                         precision: str | None = None) -> set:
    """Runs the prompt through `model` (a GptOssForCausalLM) once and writes its capture to `out`,
    declaring `precision` (default: the preset of the model's dtype). Returns what it could not
    capture."""
    import torch

    if getattr(model.config, "_attn_implementation", "eager") != "eager":
        raise CaptureError(f"capture {out}: load the model with attn_implementation=\"eager\" (the "
                           "attention weights exist only there)")
    param = next(model.parameters())
    if precision is None:
        precision = PRECISION_OF_DTYPE.get(str(param.dtype).replace("torch.", ""), "float32")
    devices = sorted({str(p.device) for p in model.parameters()})
    facts = [f"transformers {_version('transformers')}, torch {_version('torch')} on {', '.join(devices)}"]
    buffers = sorted({str(b.dtype).replace("torch.", "") for n, b in model.named_buffers() if "inv_freq" in n})
    if buffers:
        facts.append(f"rotary inv_freq in {', '.join(buffers)}")
    if param.device.type == "cuda":
        m = torch.backends.cuda.matmul
        facts.append("reduced-precision GEMM reductions: bf16 "
                     f"{getattr(m, 'allow_bf16_reduced_precision_reduction', '?')}, fp16 "
                     f"{getattr(m, 'allow_fp16_reduced_precision_reduction', '?')}, tf32 "
                     f"{getattr(m, 'allow_tf32', '?')}")
    with Capture(out, model_dir, tokens, port=port, precision=precision, device="; ".join(facts)) as cap:
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
    ap.add_argument("--device", default="cpu",
                    help="torch device (default cpu); auto: the layers spread over every visible GPU")
    ap.add_argument("--port", default="transformers", help="the name recorded as the trace's backend")
    ap.add_argument("--cast-buffers", action="store_true",
                    help="model.to(dtype) after loading, buffers included, as many scripts do: rounds "
                         "RoPE's inv_freq to the dtype (a precision bug the diff blames at q_rope)")
    args = ap.parse_args(argv)
    try:
        tokens = [int(t) for t in args.tokens.split(",")]
    except ValueError:
        print(f"parity_capture.hf: error: --tokens {args.tokens!r}: comma-separated integers", file=sys.stderr)
        return 2
    try:  # the tokens, before the model is loaded
        import os
        from . import _Config, _read_json
        config_path = os.path.join(args.model_dir, "config.json")
        raw = _read_json(config_path, "config")  # a regular file, capped, whole, bounded nesting
        if not isinstance(raw, dict):
            raise CaptureError(f"{config_path} is not a JSON object")
        vocab = _Config(raw, config_path).vocab
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
        model = load_model(args.model_dir, args.dtype, args.device, args.cast_buffers)
        skipped = capture_transformers(model, args.model_dir, tokens, args.out, args.port)
    except CaptureError as e:
        print(f"parity_capture.hf: error: {e}", file=sys.stderr)
        return 2
    print(f"parity_capture.hf: wrote {args.out} ({len(tokens)} tokens, precision "
          f"{PRECISION_OF_DTYPE[args.dtype]}" + "".join(f"; not captured: {s}" for s in sorted(skipped)) + ")")
    return 0


if __name__ == "__main__":
    sys.exit(main())
