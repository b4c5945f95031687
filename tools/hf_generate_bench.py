#!/usr/bin/env python3
"""The `run` engine's workload through Hugging Face transformers' GptOss, as a peer figure.

Loads a gpt-oss checkpoint directory with transformers (GptOssForCausalLM, bfloat16 on one GPU;
MXFP4 experts are dequantized by transformers where its MXFP4 kernels are not installed), reads
the same request file `run -m getp` reads (one prompt per line, `\\n` escapes), tokenizes it with
the directory's tokenizer.json, and for each concurrency N runs `generate` (greedy, exactly
--max-tokens new tokens: no early stop) on the first N prompts as one left-padded batch. Prints
one line per N: prompt tokens, generated tokens, wall seconds, output tokens/s, and the time to
the first token (a separate generate of one new token on the same batch).

Usage: hf_generate_bench.py MODEL_DIR REQUESTS --max-tokens 128 --batches 1,8,32,64
"""
import argparse
import sys
import time


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("requests")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--batches", default="1,8,32,64")
    ap.add_argument("--dtype", default="bfloat16")
    a = ap.parse_args()

    import torch
    import transformers
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

    print(f"torch {torch.__version__}, transformers {transformers.__version__}, "
          f"{torch.cuda.get_device_name(0)}", flush=True)
    prompts = []
    with open(a.requests, encoding="utf-8") as f:
        for line in f:
            line = line.rstrip("\n")
            if line:
                prompts.append(line.replace("\\n", "\n").replace("\\\\", "\\"))
    tok = PreTrainedTokenizerFast(tokenizer_file=f"{a.model}/tokenizer.json")
    tok.pad_token_id = 199999  # <|endoftext|>
    tok.padding_side = "left"
    t0 = time.time()
    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=getattr(torch, a.dtype),
                                                 device_map="cuda")
    model.eval()
    print(f"loaded in {time.time() - t0:.1f} s; {torch.cuda.memory_allocated() / 2**30:.1f} GiB "
          f"on the GPU; attention {model.config._attn_implementation}", flush=True)
    for n in [int(x) for x in a.batches.split(",")]:
        batch = prompts[:n]
        if len(batch) < n:
            print(f"N={n}: only {len(batch)} prompts", flush=True)
            continue
        enc = tok(batch, return_tensors="pt", padding=True).to("cuda")
        prompt_tokens = int(enc["attention_mask"].sum())
        kw = dict(do_sample=False, eos_token_id=None, pad_token_id=tok.pad_token_id)
        with torch.inference_mode():
            model.generate(**enc, max_new_tokens=2, min_new_tokens=2, **kw)  # warm-up
            torch.cuda.synchronize()
            t = time.time()
            model.generate(**enc, max_new_tokens=1, min_new_tokens=1, **kw)
            torch.cuda.synchronize()
            ttft = time.time() - t
            t = time.time()
            out = model.generate(**enc, max_new_tokens=a.max_tokens, min_new_tokens=a.max_tokens,
                                 **kw)
            torch.cuda.synchronize()
            wall = time.time() - t
        generated = (out.shape[1] - enc["input_ids"].shape[1]) * n
        print(f"N={n}: {prompt_tokens} prompt tokens, {generated} generated, wall {wall:.2f} s, "
              f"output {generated / wall:.1f} tokens/s, TTFT (batch prefill) {ttft * 1e3:.0f} ms",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
