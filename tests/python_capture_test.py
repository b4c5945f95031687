"""The Python capture (python/parity_capture), end to end with the built tools: its stage table is
model/stages.h's; the reference's own rows recorded in port layouts (interleaved RoPE, the sink
first or dropped, gate/linear halves, q/k/v parts, expert slots one by one) pass parity-trace with
every stage captured; a perturbed stage is named, with the stages a port left out listed as not
captured; bad records are refused at the call and leave no file; the checkpoint fingerprint is
the C++ tools'; and the transformers adapter's command line works without torch installed.

    python3 tests/python_capture_test.py --bin build/bin --source .
"""

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import unittest

try:
    import h5py
    import numpy as np
except ImportError as e:  # ctest reports exit 77 as skipped (SKIP_RETURN_CODE)
    print(f"python_capture_test: skipped: {e} (install python3-h5py and python3-numpy; "
          "scripts/setup.sh does)")
    sys.exit(77)

ARGS = None
TOKENS = [1, 17, 300, 42, 999, 5, 77, 128, 256, 3, 1000, 64]


def load_json(path):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def read_text(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def run(*cmd, **kw):
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, **kw)


class PythonCapture(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        sys.path.insert(0, os.path.join(ARGS.source, "python"))
        global pc
        import parity_capture as pc
        cls.tmp = tempfile.mkdtemp(prefix="parity-python-capture-")
        cls.model = os.path.join(cls.tmp, "tiny")
        r = run(os.path.join(ARGS.bin, "parity-synth"), "--preset", "tiny", "--out", cls.model)
        assert r.returncode == 0, r.stdout + r.stderr
        # Files changed in the last two seconds are not cached in the fingerprint cache; wait so
        # that the C++ run below caches them, and the Python side can read the cache.
        time.sleep(2.2)
        # The reference's rows, from a parity-trace run on the naive port's capture.
        port = os.path.join(cls.tmp, "port.h5")
        r = run(os.path.join(ARGS.bin, "naive_port"), cls.model, "--tokens", ",".join(map(str, TOKENS)),
                "--capture", port)
        assert r.returncode == 0, r.stdout + r.stderr
        r = run(os.path.join(ARGS.bin, "parity-trace"), "--model", cls.model, "--candidate-trace", port,
                "--out", os.path.join(cls.tmp, "ref"))
        assert r.returncode == 0, r.stdout + r.stderr
        cls.port = port
        cls.reference = h5py.File(os.path.join(cls.tmp, "ref", "reference.h5"), "r")

    @classmethod
    def tearDownClass(cls):
        cls.reference.close()
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def trace(self, capture, *extra):
        out = tempfile.mkdtemp(dir=self.tmp)
        r = run(os.path.join(ARGS.bin, "parity-trace"), "--model", self.model, "--candidate-trace", capture,
                "--out", out, *extra)
        return r, out

    def ref(self, pos, layer, stage):
        scope = "model" if layer == -1 else f"layer_{layer}"
        return self.reference[f"pos_{pos}/{scope}/{stage}"][()]

    def test_stage_table_is_the_headers(self):
        text = read_text(os.path.join(ARGS.source, "model", "stages.h"))
        rows = re.findall(r"^\s*X\((\w+), (\w+), (\w+), (\w+)", text, re.M)
        self.assertEqual(len(rows), 23)
        self.assertEqual([(n, s.lower(), sh, k.lower()) for n, s, sh, k in rows], list(pc.STAGES))
        header = read_text(os.path.join(ARGS.source, "capture", "parity_capture.h"))
        for name in ("ROPE_INTERLEAVED", "SINK_FIRST", "NO_SINK", "GATE_UP_HALVES", "QKV_Q", "QKV_K", "QKV_V"):
            bit = int(re.search(rf"#define PARITY_LAYOUT_{name} \(1u << (\d+)\)", header).group(1))
            self.assertEqual(getattr(pc, name), 1 << bit, name)

    def test_precision_presets_are_the_tools(self):
        from parity_capture import precision
        r = run(os.path.join(ARGS.bin, "parity-diff"), "--list-precisions")
        self.assertEqual(r.returncode, 0, r.stderr)
        tools = dict(line.split(" ", 1) for line in r.stdout.splitlines())
        self.assertEqual(list(tools), precision.preset_names())

        def per_stage(policy):  # every stage's effective fields
            base = {k: policy[k] for k in precision.FIELDS if k in policy}
            base.setdefault("intermediate_unit_roundoff", base["accumulation_unit_roundoff"])
            base.setdefault("operand_unit_roundoff", 0.0)
            base.setdefault("bias_unit_roundoff", 0.0)
            own = policy.get("stages", {})
            return {s[0]: dict(base, **own.get(s[0], {})) for s in pc.STAGES}

        for name, text in tools.items():
            ours = precision.policy(name)
            self.assertEqual(ours["name"], name)
            self.assertEqual(per_stage(json.loads(text)), per_stage(ours), name)

    def record_everything(self, path, perturb=None):
        cfg = load_json(os.path.join(self.model, "config.json"))
        H, nH, nKV, d = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
        I, L = cfg["intermediate_size"], cfg["num_hidden_layers"]
        # The reference's own rows, as float64: a capture whose values are what it computed with
        # (recorded in a coarser dtype they would be rounded copies, which the recompute would
        # take for the port's inputs).
        with pc.Capture(path, self.model, TOKENS, port="python-port", precision="float64") as cap:
            for p in range(len(TOKENS)):
                cap.record("embedding", p, -1, self.ref(p, -1, "embedding"))
                for layer in range(L):
                    for stage in [s[0] for s in pc.STAGES if s[1] != "model"]:
                        v = self.ref(p, layer, stage)
                        if perturb == (p, layer, stage):
                            v = v.copy()
                            v.reshape(-1)[3] += 0.5
                        if stage == "qkv":  # three parts; q and k as interleaved RoPE pairs
                            q, k, vv = v[: nH * d], v[nH * d: (nH + nKV) * d], v[(nH + nKV) * d:]
                            inter = lambda x: np.stack([x.reshape(-1, 2, d // 2)[:, 0], x.reshape(-1, 2, d // 2)[:, 1]],
                                                       axis=2).reshape(-1)
                            cap.record(stage, p, layer, vv, layout=pc.QKV_V)
                            cap.record(stage, p, layer, inter(k), layout=pc.QKV_K | pc.ROPE_INTERLEAVED)
                            cap.record(stage, p, layer, inter(q), layout=pc.QKV_Q | pc.ROPE_INTERLEAVED)
                        elif stage in ("q_rope", "k_rope"):
                            x = v.reshape(-1, 2, d // 2)
                            cap.record(stage, p, layer, np.stack([x[:, 0], x[:, 1]], axis=2).reshape(v.shape[0], d)
                                       , layout=pc.ROPE_INTERLEAVED)
                        elif stage == "scores":
                            cap.record(stage, p, layer, np.concatenate([v[:, -1:], v[:, :-1]], axis=1),
                                       layout=pc.SINK_FIRST)
                        elif stage == "att":  # without the sink
                            cap.record(stage, p, layer, v[:, :-1], layout=pc.NO_SINK)
                        elif stage == "mlp1":  # one slot at a time, as halves
                            for s in reversed(range(v.shape[0])):
                                cap.record(stage, p, layer, np.concatenate([v[s, 0::2], v[s, 1::2]]),
                                           slot=s, layout=pc.GATE_UP_HALVES)
                        elif stage == "topk_idx":
                            cap.record(stage, p, layer, v.astype(np.int64))
                        else:
                            cap.record(stage, p, layer, v)
                for stage in ("final_norm", "logits"):
                    cap.record(stage, p, -1, self.ref(p, -1, stage))
                cap.record("sampled", p, -1, self.ref(p, -1, "sampled"))
        return H, I

    def test_reference_rows_in_port_layouts_pass_with_every_stage_captured(self):
        path = os.path.join(self.tmp, "all.h5")
        self.record_everything(path)
        with h5py.File(path, "r") as f:  # our layout again, exactly
            np.testing.assert_array_equal(f["pos_3/layer_1/q_rope"][()], self.ref(3, 1, "q_rope"))
            np.testing.assert_array_equal(f["pos_3/layer_1/mlp1"][()], self.ref(3, 1, "mlp1"))
            np.testing.assert_array_equal(f["pos_3/layer_1/qkv"][()], self.ref(3, 1, "qkv"))
            np.testing.assert_array_equal(f["pos_3/layer_1/scores"][()], self.ref(3, 1, "scores"))
            layout = f["pos_3/layer_1/att"].attrs["layout"]
            self.assertEqual(layout.decode() if isinstance(layout, bytes) else layout, "NO_SINK")
            np.testing.assert_allclose(f["pos_3/layer_1/att"][()], self.ref(3, 1, "att"), rtol=0, atol=1e-14)
            self.assertEqual(f["pos_3/layer_1/att"].dtype, np.float64)
            self.assertEqual(f["pos_3/layer_1/topk_idx"].dtype, np.int32)
        r, out = self.trace(path)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertTrue(r.stdout.startswith("PASS: 960 datasets"), r.stdout)
        self.assertNotIn("not captured", r.stdout)
        report = load_json(os.path.join(out, "report.json"))
        self.assertEqual(report["summary"]["not_captured"]["datasets"], 0)
        self.assertEqual(report["local_source"], "recompute")
        self.assertEqual(report["summary"]["judged_accumulated_for_lack_of_inputs"], 0)
        self.assertEqual(report["candidate_backend"], "python-port")

    def test_a_perturbed_stage_is_named_and_missing_stages_are_listed(self):
        path = os.path.join(self.tmp, "partial.h5")
        with pc.Capture(path, self.model, TOKENS) as cap:
            for p in range(len(TOKENS)):
                for layer in range(4):
                    for stage in ("attn_norm", "o_proj", "moe_out"):
                        v = self.ref(p, layer, stage).astype(np.float32)
                        if (p, layer, stage) == (4, 2, "o_proj"):
                            v[5] += 0.01
                        cap.record(stage, p, layer, v)
        r, out = self.trace(path)
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        self.assertIn("first divergence at position 4, layer 2, stage o_proj: element 5", r.stdout)
        self.assertIn("datasets not captured: embedding (12 of 12), qkv (48 of 48)", r.stdout)
        report = load_json(os.path.join(out, "report.json"))
        statuses = [d["status"] for d in report["datasets"]]
        self.assertEqual(statuses.count("not_captured"), 960 - 144)
        self.assertEqual(statuses.count("fail"), 1)

    def test_bad_records_are_refused_and_leave_no_file(self):
        path = os.path.join(self.tmp, "bad.h5")
        cap = pc.Capture(path, self.model, TOKENS)
        h = np.zeros(64, np.float32)
        cases = [
            (lambda: cap.record("atn_norm", 0, 0, h), ["unknown stage 'atn_norm'", "position 0"]),
            (lambda: cap.record("attn_norm", 2, 1, h[:63]), ["stage attn_norm, layer 1, position 2", "63 values"]),
            (lambda: cap.record("embedding", 0, 0, h), ["model-scope"]),
            (lambda: cap.record("attn_norm", 12, 0, h), ["positions 0..11"]),
            (lambda: cap.record("attn_norm", 0, 4, h), ["layers 0..3"]),
            (lambda: cap.record("topk_idx", 0, 0, np.zeros(4, np.float32)), ["give integers"]),
            (lambda: cap.record("attn_norm", 0, 0, np.zeros(64, np.int32)), ["give floats"]),
            (lambda: cap.record("mlp1", 0, 0, np.zeros(128, np.float32), slot=4), ["slots are 0..3"]),
            (lambda: cap.record("o_proj", 0, 0, h, layout=pc.SINK_FIRST), ["SINK_FIRST does not apply to stage o_proj"]),
            (lambda: cap.record("topk_idx", 0, 0, np.array([0, 1, 2, 9])), ["element 3 is 9"]),
            (lambda: cap.record("qkv", 0, 1, np.zeros(32, np.float32), layout=pc.QKV_V | pc.ROPE_INTERLEAVED),
             ["stage qkv, layer 1, position 0", "v part"]),
        ]
        for call, words in cases:
            with self.assertRaises(pc.CaptureError) as e:
                call()
            for w in words + [path]:
                self.assertIn(w, str(e.exception))
        cap.record("attn_norm", 5, 3, h)
        with self.assertRaises(pc.CaptureError) as e:
            cap.record("attn_norm", 5, 3, h)
        self.assertIn("stage attn_norm, layer 3, position 5: recorded twice", str(e.exception))
        with self.assertRaises(pc.CaptureError) as e:
            cap.close()
        self.assertIn("were refused", str(e.exception))
        self.assertFalse(os.path.exists(path))
        self.assertEqual([n for n in os.listdir(self.tmp) if n.startswith("bad.h5")], [])
        # An incomplete row.
        with self.assertRaises(pc.CaptureError) as e:
            with pc.Capture(path, self.model, TOKENS) as cap:
                cap.record("swiglu", 1, 2, np.zeros(64, np.float32), slot=1)
        self.assertIn("stage swiglu, layer 2, position 1: incomplete: expert slot(s) 0, 2, 3 never recorded",
                      str(e.exception))
        self.assertFalse(os.path.exists(path))
        with self.assertRaises(pc.CaptureError):
            pc.Capture(path, self.model, [1, 1024])
        with self.assertRaises(pc.CaptureError):
            pc.Capture(path, os.path.join(self.tmp, "nowhere"), TOKENS)

    def test_fingerprint_and_model_checks(self):
        with h5py.File(self.port, "r") as f:
            cpp = f.attrs["checkpoint_fingerprint"]
            cpp = cpp.decode() if isinstance(cpp, bytes) else str(cpp)
        self.assertTrue(cpp.startswith("xxh3-128:"))
        self.assertEqual(pc.checkpoint_fingerprint(self.model), cpp)
        # Without xxhash or a valid cache the capture records no fingerprint, and the report says
        # that only the config was checked.
        copy = os.path.join(self.tmp, "copy")
        shutil.copytree(self.model, copy)
        os.remove(os.path.join(copy, ".parity-fingerprint.json"))
        # Without xxhash (simulated: the test machine has python3-xxhash) and without the cache.
        saved = sys.modules.get("xxhash")
        sys.modules["xxhash"] = None  # `import xxhash` raises ImportError
        try:
            self.assertEqual(pc.checkpoint_fingerprint(copy), "")
            path = os.path.join(self.tmp, "no-fingerprint.h5")
            with self.assertWarns(pc.FingerprintWarning) as w:
                cap = pc.Capture(path, copy, TOKENS)
            self.assertIn("python3-xxhash", str(w.warning))
            self.assertIn("the diff will check the config only", str(w.warning))
            with cap:
                cap.record("embedding", 0, -1, self.ref(0, -1, "embedding").astype(np.float32))
        finally:
            if saved is None:
                del sys.modules["xxhash"]
            else:
                sys.modules["xxhash"] = saved
        r, _ = self.trace(path)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("the capture records no fingerprint; only its config was checked", r.stdout)
        # A capture of the same weights under another config is refused by parity-trace.
        other = os.path.join(self.tmp, "other")
        shutil.copytree(self.model, other)
        cfg = load_json(os.path.join(other, "config.json"))
        cfg["swiglu_limit"] = 6.0
        with open(os.path.join(other, "config.json"), "w", encoding="utf-8") as f:
            json.dump(cfg, f)
        path = os.path.join(self.tmp, "other.h5")
        with pc.Capture(path, other, TOKENS) as cap:
            cap.record("embedding", 0, -1, self.ref(0, -1, "embedding").astype(np.float32))
        r, _ = self.trace(path)
        self.assertEqual(r.returncode, 2, r.stdout + r.stderr)
        self.assertEqual(len(r.stdout.splitlines()) + len(r.stderr.splitlines()), 1, r.stdout + r.stderr)
        self.assertIn(f"{path}: a capture of another model", r.stderr)
        self.assertIn("swiglu_limit", r.stderr)

    def test_generated_tokens_are_appended_as_the_port_goes(self):
        path = os.path.join(self.tmp, "appended.h5")
        with pc.Capture(path, self.model, TOKENS[:8], port="generating-port", precision="float64") as cap:
            for p in range(len(TOKENS)):
                if p >= 8:  # the port generated this token: append it, then record its rows
                    cap.append_tokens([TOKENS[p]])
                for stage in ("embedding", "final_norm", "logits"):
                    cap.record(stage, p, -1, self.ref(p, -1, stage))
        # A position past the tokens appended so far, a token outside the vocabulary: refused.
        other = pc.Capture(os.path.join(self.tmp, "appended-bad.h5"), self.model, TOKENS[:8])
        with self.assertRaises(pc.CaptureError) as e:
            other.record("embedding", 8, -1, self.ref(8, -1, "embedding"))
        self.assertIn("positions 0..7", str(e.exception))
        with self.assertRaises(pc.CaptureError) as e:
            other.append_tokens([5, 1024])
        self.assertIn("token id 1024 at position 9 is out of range", str(e.exception))
        self.assertEqual(len(other.tokens), 8, "nothing of a refused append is kept")
        other.abandon()
        with h5py.File(path, "r") as f:
            self.assertEqual(list(f.attrs["tokens"]), TOKENS)
            self.assertEqual(list(f.attrs["positions"]), list(range(len(TOKENS))))
        r, out = self.trace(path)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        report = load_json(os.path.join(out, "report.json"))
        self.assertEqual(report["tokens"], TOKENS)
        with self.assertRaises(pc.CaptureError) as e:
            pc.Capture(os.path.join(self.tmp, "floats.h5"), self.model, [1.0, 2.5])
        self.assertIn("token ids are integers, not float64", str(e.exception))

    def test_cache_rows_in_bulk_skip_the_prefix(self):
        cfg = load_json(os.path.join(self.model, "config.json"))
        path = os.path.join(self.tmp, "cached.h5")
        first = 6
        with pc.Capture(path, self.model, TOKENS, port="long-port", precision="float64") as cap:
            for layer in range(cfg["num_hidden_layers"]):
                k = np.stack([self.ref(p, layer, "k_rope") for p in range(first)])
                v = np.stack([self.ref(p, layer, "v") for p in range(first)])
                # k in interleaved RoPE pairs, as ports that permute their weights hold it
                kk = np.stack([k[..., : k.shape[-1] // 2], k[..., k.shape[-1] // 2:]], axis=-1).reshape(k.shape)
                cap.record_cache(layer, kk, v, layout=pc.ROPE_INTERLEAVED)
            for p in range(first, len(TOKENS)):
                cap.record("embedding", p, -1, self.ref(p, -1, "embedding"))
                for layer in range(cfg["num_hidden_layers"]):
                    for stage in ("attn_norm", "qkv", "q_rope", "k_rope", "v", "scores", "att", "attn_out"):
                        cap.record(stage, p, layer, self.ref(p, layer, stage))
        r, out = self.trace(path)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        report = load_json(os.path.join(out, "report.json"))
        self.assertTrue(report["accumulated_unavailable"])
        judged = [d for d in report["datasets"] if d["status"] != "not_captured"]
        self.assertEqual({d["position"] for d in judged}, set(range(first, len(TOKENS))))
        scores = [d for d in judged if d["stage"] == "scores"]
        self.assertTrue(all(d["judged"] == "local" and d["local"]["max_abs_err"] == 0 for d in scores), scores[:1])
        # Stage rows inside the cached prefix, a layer without its cache: refused, nothing written.
        bad = os.path.join(self.tmp, "cached-bad.h5")
        cap = pc.Capture(bad, self.model, TOKENS)
        cap.record_cache(0, np.zeros((4, 2, 16), np.float32), np.zeros((4, 2, 16), np.float32))
        with self.assertRaises(pc.CaptureError) as e:
            cap.record_cache(1, np.zeros((5, 2, 16), np.float32), np.zeros((5, 2, 16), np.float32))
        self.assertIn("every layer caches the same positions", str(e.exception))
        cap.abandon()
        cap = pc.Capture(bad, self.model, TOKENS)
        for layer in range(cfg["num_hidden_layers"]):
            cap.record_cache(layer, np.zeros((4, 2, 16), np.float32), np.zeros((4, 2, 16), np.float32))
        cap.record("embedding", 2, -1, self.ref(2, -1, "embedding"))
        with self.assertRaises(pc.CaptureError) as e:
            cap.close()
        self.assertIn("rows at position 2 lie inside the cache prefix 0..3", str(e.exception))
        self.assertFalse(os.path.exists(bad))

    def test_the_package_installs_with_pip(self):
        import importlib.util
        missing = [m for m in ("pip", "setuptools") if importlib.util.find_spec(m) is None]
        if missing:
            self.skipTest(f"{' and '.join(missing)} missing: Debian's python3-pip and python3-setuptools")
        src = os.path.join(self.tmp, "pkg-src")
        shutil.copytree(os.path.join(ARGS.source, "python"), src,
                        ignore=shutil.ignore_patterns("__pycache__", "build", "*.egg-info"))
        target = os.path.join(self.tmp, "pkg")
        r = run(sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "--no-index",
                "--target", target, src)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        env = dict(os.environ, PYTHONPATH=target)
        r = run(sys.executable, "-c", "import parity_capture, parity_capture.hf, parity_capture.precision as p; "
                "print(parity_capture.__file__); print(p.preset_names())", env=env, cwd=self.tmp)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertTrue(r.stdout.startswith(target), r.stdout)
        self.assertIn("transformers-bf16", r.stdout)

    def test_hf_adapter_command_line_without_torch(self):
        env = dict(os.environ, PYTHONPATH=os.path.join(ARGS.source, "python"))
        r = run(sys.executable, "-m", "parity_capture.hf", "--help", env=env)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("--candidate-trace", r.stdout)
        try:
            import torch  # noqa: F401
            import transformers  # noqa: F401
            return
        except ImportError:
            pass
        r = run(sys.executable, "-m", "parity_capture.hf", self.model, "--tokens", "1,2", "--out",
                os.path.join(self.tmp, "hf.h5"), env=env)
        self.assertEqual(r.returncode, 2)
        self.assertIn("parity_capture.hf: error: needs torch and transformers", r.stderr)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--source", required=True)
    ARGS, rest = ap.parse_known_args()
    unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)
