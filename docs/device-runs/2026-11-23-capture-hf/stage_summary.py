# Per stage, at layer 0 and over all layers: the largest accumulated NMSE and relative error of a
# capture's report.json (where transformers' own float32 RoPE / RMSNorm show up in a float64 run).
import json, sys
j = json.load(open(sys.argv[1]))
best = {}
for d in j["datasets"]:
    a = d.get("accumulated")
    if not a or d.get("status") == "not_captured":
        continue
    key = d["stage"]
    l0 = d.get("layer") in (0, None)
    cur = best.setdefault(key, [0.0, 0.0, 0.0])
    cur[0] = max(cur[0], a.get("nmse") or 0.0)
    if l0:
        cur[1] = max(cur[1], a.get("nmse") or 0.0)
    cur[2] = max(cur[2], a.get("share") or 0.0)
order = ["embedding", "attn_norm", "qkv", "q_rope", "k_rope", "v", "scores", "att", "attn_out", "o_proj",
         "resid_attn", "ffn_norm", "router", "topk_w", "mlp1", "swiglu", "mlp2", "moe_out", "resid_ffn",
         "final_norm", "logits"]
print("  stage: max NMSE layer 0 / all layers, largest share of the tolerance")
for s in order:
    if s in best:
        v = best[s]
        print(f"  {s:<11} {v[1]:.2e} / {v[0]:.2e}  {v[2]:.3g}")
