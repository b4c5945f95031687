#!/usr/bin/env python3
"""Validation data from the official implementation (transformers' GptOss).

Builds a small random GptOss model with transformers, rounds every weight to BF16, saves it
with save_pretrained (the dequantized layout: experts gate_up_proj [E, H, 2I] and down_proj
[E, I, H], input-major; config.json with transformers 5's rope_parameters), then runs it in
float64 (eager attention) over a token sequence longer than its sliding window and writes
expected.safetensors with:
  tokens          I32 [T]
  logits          F64 [T, V]
  hidden.<l>      F64 [T, H]   output of decoder layer l (resid_ffn in our stage names)
  final_norm      F64 [T, H]
Run where torch and transformers are installed:
  python3 tools/hf_validate.py --out golden/hf-tiny
The C++ test tests/hf_validation_test.cpp checks the float64 reference against it on every CI
run. transformers computes RoPE frequencies and angles in float32 even in a float64 model, so
agreement is about 1e-6 relative, not 1e-15 (see the spec).
"""
import argparse
import json
import os

import torch
import transformers
from safetensors.torch import save_file
from transformers import GptOssConfig, GptOssForCausalLM


def build(seed: int):
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
    # default init (std 0.02) would leave every branch cold.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("layernorm.weight") or name == "model.norm.weight":
                v = 1 + randn(p.shape, 0.1)
            elif name.endswith("sinks"):
                v = randn(p.shape, 1.0)
            elif name.endswith("experts.gate_up_proj"):   # [E, H, 2I], input-major
                v = randn(p.shape, 3.0 / p.shape[1] ** 0.5)
            elif name.endswith("experts.down_proj"):      # [E, I, H]
                v = randn(p.shape, 0.3 / p.shape[1] ** 0.5)
            elif name.endswith("bias"):
                v = randn(p.shape, 0.1)
            elif name == "model.embed_tokens.weight":
                v = randn(p.shape, 1.0)
            elif p.dim() == 2:                            # [out, in]
                v = randn(p.shape, 1.0 / p.shape[1] ** 0.5)
            else:
                raise RuntimeError(f"unexpected parameter {name} {tuple(p.shape)}")
            p.copy_(v.to(torch.bfloat16).to(p.dtype))   # weights exactly representable in BF16
    return cfg, model


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--tokens", type=int, default=24)
    args = ap.parse_args()

    cfg, model = build(args.seed)
    os.makedirs(args.out, exist_ok=True)
    model.to(torch.bfloat16).save_pretrained(args.out, safe_serialization=True)

    # Eager attention and the eager (per-expert loop) experts: the fused grouped_mm path
    # refuses float64.
    m64 = GptOssForCausalLM.from_pretrained(args.out, dtype=torch.float64, attn_implementation="eager",
                                            experts_implementation="eager").eval()
    tokens = torch.randint(0, cfg.vocab_size, (1, args.tokens), generator=torch.Generator().manual_seed(args.seed + 1))
    captured = {}

    def hook(name):
        def f(_module, _inputs, output):
            out = output[0] if isinstance(output, tuple) else output
            captured[name] = out.detach().to(torch.float64)[0].clone()
        return f

    for i, layer in enumerate(m64.model.layers):
        layer.register_forward_hook(hook(f"hidden.{i}"))
    m64.model.norm.register_forward_hook(hook("final_norm"))
    with torch.no_grad():
        out = m64(input_ids=tokens, use_cache=False)
    tensors = {"tokens": tokens[0].to(torch.int32).contiguous(),
               "logits": out.logits[0].to(torch.float64).contiguous()}
    tensors.update({k: v.contiguous() for k, v in captured.items()})
    save_file(tensors, os.path.join(args.out, "expected.safetensors"),
              metadata={"torch": torch.__version__, "transformers": transformers.__version__,
                        "seed": str(args.seed), "generator": "tools/hf_validate.py"})
    with open(os.path.join(args.out, "README.md"), "w") as f:
        f.write("# hf-tiny: validation data from transformers' GptOss\n\n"
                f"Written by `python3 tools/hf_validate.py --out golden/hf-tiny --seed {args.seed}` "
                f"with torch {torch.__version__}, transformers {transformers.__version__}.\n"
                "model.safetensors + config.json: a random BF16 GptOss model as save_pretrained writes it.\n"
                "expected.safetensors: tokens, float64 logits, per-layer hidden states, final norm.\n")
    print(json.dumps({"out": args.out, "tokens": tokens[0].tolist(),
                      "logits_absmax": float(out.logits.abs().max()),
                      "files": sorted(os.listdir(args.out))}))


if __name__ == "__main__":
    main()
