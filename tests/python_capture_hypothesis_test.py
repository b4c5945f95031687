"""The Python capture (python/parity_capture) against hostile arguments: whatever a caller passes
to Capture(...), record(...), record_cache(...) and append_tokens(...), only CaptureError escapes,
with one line; a position, layer, slot, layout or token that is not an exact integer (a float,
string or bool) is refused, never truncated; and after any failure (a refused call, an error
inside a record, an exception in the `with` block) no file and no temporary file is left. The
arguments are drawn by Hypothesis (deterministic: derandomize), plus the cases found before.
Needs no built tool: the model is a config.json (the Python capture reads nothing else).

    python3 tests/python_capture_hypothesis_test.py --source .
"""

import argparse
import json
import math
import os
import shutil
import sys
import tempfile
import threading
import unittest
import warnings

try:
    import h5py  # noqa: F401
    import numpy as np
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st
    from hypothesis.extra import numpy as hnp
except ImportError as e:  # ctest reports exit 77 as skipped (SKIP_RETURN_CODE)
    print(f"python_capture_hypothesis_test: skipped: {e} (install python3-h5py, python3-numpy and "
          "python3-hypothesis; scripts/setup.sh does)")
    sys.exit(77)

ARGS = None
pc = None
# The tiny preset's shapes: H 64, 4 layers, 4 heads of 16, 2 KV heads, I 64, 8 experts, 4 per token.
CONFIG = {"vocab_size": 1024, "hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4,
          "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 64, "num_local_experts": 8,
          "num_experts_per_tok": 4, "max_position_embeddings": 4096}
TOKENS = [1, 17, 300, 42]
# Settings for every drawn test: bounded and reproducible, a few seconds each.
FUZZ = settings(max_examples=200, deadline=None, derandomize=True, database=None,
                suppress_health_check=list(HealthCheck))


def nested(depth):
    v = [1.0]
    for _ in range(depth):
        v = [v]
    return v


class Raising:
    """An object that fails whatever numpy asks of it."""

    def __array__(self, *a, **k):
        raise RuntimeError("no array here")

    def __len__(self):
        raise OverflowError("too long")

    def __index__(self):
        raise OverflowError("no index")


def small_lists(inner):
    return st.lists(inner, max_size=3)


# Values of every kind a caller might pass by mistake.
ANYTHING = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=12), st.binary(max_size=8),
    st.complex_numbers(), st.just(math.nan), st.just(2 ** 100), st.just(-(2 ** 70)),
    st.just(np.float64(1.0)), st.just(np.bool_(True)), st.just(np.int64(-1)), st.just(np.uint64(2 ** 64 - 1)),
    st.lists(st.integers(min_value=-5, max_value=2000), max_size=6),
    st.lists(st.floats(), max_size=6),
    st.recursive(st.integers(0, 9) | st.floats(), small_lists, max_leaves=8),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
    st.builds(nested, st.just(5000)), st.just(Raising()), st.just(object()), st.just([[1.0], [2.0, 3.0]]),
    hnp.arrays(st.sampled_from([np.float16, np.float32, np.float64, np.int32, np.uint64, np.bool_,
                                np.complex64]),
               hnp.array_shapes(min_dims=0, max_dims=2, max_side=4)),
)
STAGES = ["embedding", "attn_norm", "qkv", "q_rope", "k_rope", "v", "scores", "att", "attn_out",
          "o_proj", "router", "topk_idx", "topk_w", "mlp1", "swiglu", "mlp2", "logits", "sampled"]
# Row sizes some stage really has, so that drawn records are sometimes accepted.
SIZES = [1, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2 * 4, 3 * 4, 4 * 5]


def small_int():
    return st.integers(min_value=-2, max_value=5)


def row(dtype, size, fill, special):
    """An array of a size some stage has: `fill`, and for reals one special value (NaN, inf)."""
    a = np.full(size, fill, dtype=np.float64)
    if special is not None and np.dtype(dtype).kind == "f":
        a[size // 2] = special
    return a.astype(dtype)


def values():
    # Built whole rather than element by element: drawing 1024 elements one by one is slow.
    sized = st.builds(row, st.sampled_from([np.float32, np.float64, np.float16, np.int32, np.int64,
                                            np.uint64, np.bool_]),
                      st.sampled_from(SIZES), st.integers(0, 9),
                      st.sampled_from([None, math.nan, math.inf, -math.inf, 0.5]))
    return st.one_of(sized, ANYTHING)


RECORD = st.fixed_dictionaries({
    "stage": st.one_of(st.sampled_from(STAGES), ANYTHING),
    "position": st.one_of(small_int(), ANYTHING),
    "layer": st.one_of(small_int(), ANYTHING),
    "values": values(),
}, optional={
    "slot": st.one_of(small_int(), ANYTHING),
    "layout": st.one_of(st.sampled_from([0, 1, 2, 4, 8, 16, 32, 64, 3, 17]), ANYTHING),
})
CACHE = st.fixed_dictionaries({"layer": st.one_of(small_int(), ANYTHING), "k": values(), "v": values()},
                              optional={"layout": ANYTHING})


class Hostile(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        sys.path.insert(0, os.path.join(ARGS.source, "python"))
        global pc
        import parity_capture
        pc = parity_capture
        warnings.simplefilter("ignore", pc.FingerprintWarning)  # a config.json has no weights
        cls.tmp = tempfile.mkdtemp(prefix="parity-python-capture-hostile-")
        cls.model = os.path.join(cls.tmp, "tiny")
        os.makedirs(cls.model)
        with open(os.path.join(cls.model, "config.json"), "w", encoding="utf-8") as f:
            json.dump(CONFIG, f)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def out_dir(self):
        d = tempfile.mkdtemp(dir=self.tmp)
        self.addCleanup(shutil.rmtree, d, True)
        return d

    def refused(self, call, *words):
        with self.assertRaises(pc.CaptureError) as e:
            call()
        message = str(e.exception)
        self.assertNotIn("\n", message)
        for w in words:
            self.assertIn(w, message)
        return message

    def assert_empty(self, d):
        self.assertEqual(os.listdir(d), [], "a failed capture left a file behind")

    def test_non_integers_are_refused_not_truncated(self):
        d = self.out_dir()
        path = os.path.join(d, "c.h5")
        h = np.zeros(64, np.float32)
        for tokens in ([1, 2.0], [1.5], ["1"], [True, 1], np.array([1.0, 2.0])):
            self.refused(lambda: pc.Capture(path, self.model, tokens), "token ids")
        cap = pc.Capture(path, self.model, TOKENS)
        for bad in (1.0, 1.5, "1", True, np.float64(1), None):
            self.refused(lambda: cap.record("attn_norm", bad, 0, h), "the position is an integer")
            self.refused(lambda: cap.record("attn_norm", 1, bad, h), "the layer is an integer")
            self.refused(lambda: cap.record("mlp1", 1, 0, np.zeros(128, np.float32), slot=bad),
                         "the slot is an integer")
            self.refused(lambda: cap.record("att", 1, 0, np.zeros(12, np.float32), layout=bad),
                         "the layout is an integer")
            self.refused(lambda: cap.record_cache(bad, np.zeros(32), np.zeros(32)), "the layer is an integer")
            self.refused(lambda: cap.append_tokens([bad]), "token ids")
        self.refused(lambda: cap.record("att", 1, 0, np.zeros(12, np.float32), layout=1 << 40),
                     "no layout flag")
        # NumPy integers are integers.
        cap.record("attn_norm", np.int64(1), np.int32(0), h)
        self.refused(cap.close, "were refused")
        self.assert_empty(d)

    def test_a_record_that_fails_inside_is_a_refused_record(self):
        d = self.out_dir()
        cap = pc.Capture(os.path.join(d, "c.h5"), self.model, TOKENS)
        write = cap._write

        def failing(*a, **k):
            raise OSError(28, "No space left on device")
        cap._write = failing
        self.refused(lambda: cap.record("attn_norm", 0, 0, np.zeros(64, np.float32)),
                     "record() failed: OSError", "No space left")
        cap._write = write
        cap.record("attn_norm", 1, 0, np.zeros(64, np.float32))
        self.refused(cap.close, "1 record(s) were refused")
        self.assert_empty(d)

    def test_an_exception_in_the_with_block_leaves_no_file(self):
        d = self.out_dir()
        with self.assertRaises(KeyError):
            with pc.Capture(os.path.join(d, "c.h5"), self.model, TOKENS) as cap:
                cap.record("attn_norm", 0, 0, np.zeros(64, np.float32))
                raise KeyError("the port failed")
        self.assert_empty(d)

    def test_two_captures_of_one_path_keep_their_own_temporary_files(self):
        d = self.out_dir()
        path = os.path.join(d, "c.h5")
        a = pc.Capture(path, self.model, TOKENS)
        b = pc.Capture(path, self.model, TOKENS)
        self.assertEqual(len(os.listdir(d)), 2)
        a.record("embedding", 0, -1, np.full(64, 1.0, np.float32))
        b.record("embedding", 0, -1, np.full(64, 2.0, np.float32))
        b.abandon()
        a.close()
        with h5py.File(path, "r") as f:
            self.assertEqual(f["pos_0/model/embedding"][0], 1.0)
        self.assertEqual(os.listdir(d), ["c.h5"])

    def test_bad_configs_and_paths_are_refused(self):
        d = self.out_dir()
        path = os.path.join(d, "c.h5")
        for change in ({"vocab_size": 1024.0}, {"hidden_size": True}, {"num_hidden_layers": 2 ** 40},
                       {"head_dim": "16"}, {"num_experts_per_tok": 2, "experts_per_token": 4},
                       {"num_experts_per_tok": 9}):
            model = os.path.join(d, "model")
            os.makedirs(model, exist_ok=True)
            with open(os.path.join(model, "config.json"), "w", encoding="utf-8") as f:
                json.dump({**CONFIG, **change}, f)
            self.refused(lambda: pc.Capture(path, model, TOKENS), "config.json")
        with open(os.path.join(model, "config.json"), "w", encoding="utf-8") as f:
            f.write("[" * 100000 + "]" * 100000)
        self.refused(lambda: pc.Capture(path, model, TOKENS), "config.json")
        with open(os.path.join(model, "config.json"), "wb") as f:
            f.write(json.dumps(CONFIG).encode() + b"\0garbage")
        self.refused(lambda: pc.Capture(path, model, TOKENS), "not JSON")
        # A FIFO as config.json is refused at once, not read (it would block).
        os.remove(os.path.join(model, "config.json"))
        os.mkfifo(os.path.join(model, "config.json"))
        done = []
        t = threading.Thread(target=lambda: done.append(self.refused(
            lambda: pc.Capture(path, model, TOKENS), "not a regular file")), daemon=True)
        t.start()
        t.join(20)
        self.assertTrue(done, "a FIFO as config.json blocked the capture")
        os.remove(os.path.join(model, "config.json"))
        for bad in (b"", "", "a\0b", 5, None):
            self.refused(lambda: pc.Capture(bad, self.model, TOKENS))
        self.refused(lambda: pc.Capture(path, self.model, TOKENS, port=b"x"), "the port is text")
        # A path's control characters are escaped: the message stays one line.
        odd = os.path.join(d, "c\n\x1b[2J.h5")
        self.refused(lambda: pc.Capture(odd, self.model, TOKENS, port=1), "c\\n\\x1b[2J.h5: the port is text")
        self.refused(lambda: pc.Capture(path, self.model, TOKENS, device=["gpu"]), "the device is text")
        self.refused(lambda: pc.Capture(os.path.join(d, "no", "dir.h5"), self.model, TOKENS))
        self.assertEqual(sorted(os.listdir(d)), ["model"])

    @FUZZ
    @given(path=st.one_of(st.just("ok"), ANYTHING), model=st.one_of(st.just("ok"), ANYTHING),
           tokens=st.one_of(st.lists(st.integers(0, 1023), min_size=1, max_size=4), ANYTHING),
           options=st.fixed_dictionaries({}, optional={"port": ANYTHING, "precision": ANYTHING,
                                                       "device": ANYTHING}))
    def test_drawn_opens_raise_capture_error_only(self, path, model, tokens, options):
        d = tempfile.mkdtemp(dir=self.tmp)
        try:
            p = os.path.join(d, "c.h5") if isinstance(path, str) and path == "ok" else path
            m = self.model if isinstance(model, str) and model == "ok" else model
            try:
                cap = pc.Capture(p, m, tokens, **options)
            except pc.CaptureError as e:
                self.assertNotIn("\n", str(e))
            else:
                cap.abandon()
            self.assertEqual(os.listdir(d), [])
        finally:
            shutil.rmtree(d, ignore_errors=True)

    @FUZZ
    @given(calls=st.lists(st.one_of(st.tuples(st.just("record"), RECORD),
                                    st.tuples(st.just("record_cache"), CACHE),
                                    st.tuples(st.just("append_tokens"),
                                              st.fixed_dictionaries({"tokens": ANYTHING}))),
                          min_size=1, max_size=6),
           raise_inside=st.booleans())
    def test_drawn_records_raise_capture_error_only_and_failures_leave_no_file(self, calls, raise_inside):
        d = tempfile.mkdtemp(dir=self.tmp)
        try:
            path = os.path.join(d, "c.h5")
            refused = False
            try:
                with pc.Capture(path, self.model, TOKENS) as cap:
                    for method, kwargs in calls:
                        try:
                            getattr(cap, method)(**kwargs)
                        except pc.CaptureError as e:
                            self.assertNotIn("\n", str(e))
                            refused = refused or method != "append_tokens"
                    if raise_inside:
                        raise LookupError("the port failed")
            except pc.CaptureError as e:  # close() refused
                self.assertNotIn("\n", str(e))
                self.assertEqual(os.listdir(d), [])
            except LookupError:
                self.assertTrue(raise_inside)
                self.assertEqual(os.listdir(d), [])
            else:
                self.assertFalse(refused or raise_inside, "a capture with a refused record was written")
                self.assertEqual(os.listdir(d), ["c.h5"])
        finally:
            shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--source", default=os.path.join(os.path.dirname(__file__), ".."))
    ARGS, rest = parser.parse_known_args()
    unittest.main(argv=[sys.argv[0]] + rest)
