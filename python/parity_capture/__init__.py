"""parity_capture: trace your own gpt-oss port (NumPy, PyTorch, JAX, ...) into a gpt-oss-parity
trace, then diff it against the float64 reference:

    from parity_capture import Capture, SINK_FIRST

    with Capture("port.h5", "models/tiny", tokens=[1, 2, 3], port="my-port") as cap:
        for pos, tok in enumerate(tokens):
            ...
            cap.record("q_rope", pos, layer, q)             # [n_heads, head_dim]
            cap.record("att", pos, layer, probs, layout=SINK_FIRST)
            cap.record("mlp1", pos, layer, h, slot=s)       # one expert slot
    # then: parity-trace --model models/tiny --candidate-trace port.h5 --out out/port

The Python twin of capture/parity_capture.h, in pure h5py + NumPy: the same stages, shapes,
layouts, checks and file (a gpt-oss-parity trace, format version 2, written under a temporary
name and renamed by close()). Tensors may be NumPy arrays, PyTorch tensors (any device, any
dtype; copied to the host), or anything numpy.asarray takes.

Stages, per position (one token row), as model/stages.h lists them: embedding [H] (model scope,
layer -1); per layer attn_norm [H], qkv [(nH + 2 nKV) d] (q | k | v, pre-RoPE), q_rope [nH, d],
k_rope [nKV, d], v [nKV, d], scores [nH, pos + 2] (keys 0..pos, then the sink; masked keys -inf),
att [nH, pos + 2], attn_out [nH d], o_proj, resid_attn, ffn_norm [H], router [E], topk_idx [k]
(integers), topk_w [k], mlp1 [k, 2I] (gate/linear interleaved), swiglu [k, I], mlp2 [k, H] (per
expert slot, in topk_idx's order; record one slot with slot=s), moe_out, resid_ffn [H]; then
final_norm [H], logits [V], sampled [1] (model scope).

Layouts (combine with |; each applies to the stages named):
    ROPE_INTERLEAVED  q_rope, k_rope, the q and k parts of qkv: heads in interleaved RoPE pairs
                      (2i, 2i+1) instead of half-split (i, i + d/2)
    SINK_FIRST        scores, att: the sink is column 0
    NO_SINK           att: [nH, pos + 1] without the sink's column (its share is taken as 1 - the
                      keys' sum, which a softmax without the sink leaves at 0)
    GATE_UP_HALVES    mlp1: [gate | linear] halves instead of interleaved
    QKV_Q, QKV_K, QKV_V  qkv: this record is only the q, k or v part
"""

from __future__ import annotations

import datetime
import functools
import json
import os
import secrets
import stat
import warnings

import h5py
import numpy as np

from . import precision as _precision

__all__ = [
    "Capture", "CaptureError", "FingerprintWarning", "STAGES", "stage_shape", "checkpoint_fingerprint",
    "ROPE_INTERLEAVED", "SINK_FIRST", "NO_SINK", "GATE_UP_HALVES", "QKV_Q", "QKV_K", "QKV_V",
]

TRACE_FORMAT = "gpt-oss-parity-trace"
TRACE_FORMAT_VERSION = 2
CAPTURE_VERSION = "1.1"

# The layout flags, the same bits as parity_capture.h.
ROPE_INTERLEAVED = 1 << 0
SINK_FIRST = 1 << 1
NO_SINK = 1 << 2
GATE_UP_HALVES = 1 << 3
QKV_Q = 1 << 4
QKV_K = 1 << 5
QKV_V = 1 << 6
_LAYOUT_NAMES = {ROPE_INTERLEAVED: "ROPE_INTERLEAVED", SINK_FIRST: "SINK_FIRST", NO_SINK: "NO_SINK",
                 GATE_UP_HALVES: "GATE_UP_HALVES", QKV_Q: "QKV_Q", QKV_K: "QKV_K", QKV_V: "QKV_V"}
_QKV_PARTS = QKV_Q | QKV_K | QKV_V

# The stage list of model/stages.h, in execution order within a position: (name, scope, shape,
# kind). The test tests/python_capture_test.py checks this table against that header.
STAGES = (
    ("embedding", "model", "hidden", "real"),
    ("attn_norm", "layer", "hidden", "real"),
    ("qkv", "layer", "qkv", "real"),
    ("q_rope", "layer", "q", "real"),
    ("k_rope", "layer", "kv", "real"),
    ("v", "layer", "kv", "real"),
    ("scores", "layer", "keys", "real"),
    ("att", "layer", "keys", "real"),
    ("attn_out", "layer", "head_out", "real"),
    ("o_proj", "layer", "hidden", "real"),
    ("resid_attn", "layer", "hidden", "real"),
    ("ffn_norm", "layer", "hidden", "real"),
    ("router", "layer", "experts", "real"),
    ("topk_idx", "layer", "topk", "index"),
    ("topk_w", "layer", "topk", "real"),
    ("mlp1", "expert", "mlp1", "real"),
    ("swiglu", "expert", "inter", "real"),
    ("mlp2", "expert", "expert_hidden", "real"),
    ("moe_out", "layer", "hidden", "real"),
    ("resid_ffn", "layer", "hidden", "real"),
    ("final_norm", "model", "hidden", "real"),
    ("logits", "model", "vocab", "real"),
    ("sampled", "model", "token", "index"),
)
_STAGE = {s[0]: s for s in STAGES}
_PROLOGUE = ("embedding",)
_EPILOGUE = ("final_norm", "logits", "sampled")
_LAYER_STAGES = tuple(s[0] for s in STAGES if s[1] != "model")

_LAYOUTS_FOR = {
    "qkv": ROPE_INTERLEAVED | _QKV_PARTS,
    "q_rope": ROPE_INTERLEAVED,
    "k_rope": ROPE_INTERLEAVED,
    "scores": SINK_FIRST,
    "att": SINK_FIRST | NO_SINK,
    "mlp1": GATE_UP_HALVES,
}

class CaptureError(ValueError):
    """A record, a model directory or a file the capture refuses; the message is one line naming
    the file, stage, layer and position (control characters of a path or value escaped)."""

    def __init__(self, message):
        super().__init__(_one_line(message, 4000))


class FingerprintWarning(UserWarning):
    """The capture records no checkpoint fingerprint: the diff will check the config only."""


# Caps on what a capture reads of a checkpoint's small JSON files (config.json, the shard index).
_MAX_JSON_BYTES = 64 << 20
_MAX_DIM = (1 << 31) - 1  # a config's sizes, as the C++ Config keeps them (int)


def _one_line(text: str, cap: int = 200) -> str:
    """`text` as one printable line of at most `cap` characters (then "..."): control characters
    and what is not valid UTF-8 escaped, for quoting what came from a caller or a file."""
    t = str(text)
    short = t[:cap].encode("utf-8", "backslashreplace").decode("utf-8")
    out = "".join(ch if ch.isprintable() else ch.encode("unicode_escape").decode("ascii") for ch in short)
    return out + ("..." if len(t) > cap else "")


def _quoted(value, cap: int = 64) -> str:
    """A caller's value for a message: a string quoted and escaped, anything else by its type."""
    if isinstance(value, str):
        return repr(value[:cap]) + ("..." if len(value) > cap else "")
    kind = type(value).__name__
    kind = ("an " if kind[:1] in "aeiou" else "a ") + kind
    if isinstance(value, (bool, int, float, complex, np.generic)):
        try:
            text = repr(value)
        except ValueError:  # an int of more digits than Python prints
            return kind
        return f"{text[:cap]}{'...' if len(text) > cap else ''} ({kind})"
    return kind


def _is_integer(value) -> bool:
    """An exact integer: int or a NumPy integer, not bool (True is not a position)."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def _path(value, what: str) -> str:
    """A caller's path (str, bytes or os.PathLike) as a str, or CaptureError."""
    try:
        p = os.fspath(value)
    except TypeError:
        raise CaptureError(f"capture: the {what} is a path (str or os.PathLike), not "
                           f"{_quoted(value)}") from None
    if isinstance(p, bytes):
        p = os.fsdecode(p)
    if not p:
        raise CaptureError(f"capture: empty {what}")
    if "\0" in p:
        raise CaptureError(f"capture: the {what} {_quoted(p, 200)} holds a NUL character")
    return p


def _read_json(path: str, what: str):
    """A small JSON file, read as the C++ readers read one: a regular file only (a FIFO would
    block), capped in size, parsed whole (trailing bytes refused), nesting bounded."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError as e:
        raise CaptureError(f"{path}: cannot open the {what} ({e.strerror})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise CaptureError(f"{path}: the {what} is not a regular file")
        if st.st_size > _MAX_JSON_BYTES:
            raise CaptureError(f"{path}: the {what} is {st.st_size} bytes, more than the "
                               f"{_MAX_JSON_BYTES} a {what} may have")
        with os.fdopen(os.dup(fd), "rb") as f:
            data = f.read(_MAX_JSON_BYTES + 1)
    except OSError as e:
        raise CaptureError(f"{path}: cannot read the {what} ({e.strerror})") from None
    finally:
        os.close(fd)
    try:
        return json.loads(data.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise CaptureError(f"{path}: the {what} is not UTF-8 (byte {e.start})") from None
    except RecursionError:
        raise CaptureError(f"{path}: the {what} nests too deep") from None
    except ValueError as e:
        raise CaptureError(f"{path}: the {what} is not JSON ({_one_line(e)})") from None


class _Config:
    """The fields of a gpt-oss config.json the stage shapes need."""

    def __init__(self, raw: dict, source: str):
        def field(name, *aliases, default=None):
            present = [(n, raw[n]) for n in (name,) + aliases if n in raw]
            if not present:
                if default is None:
                    raise CaptureError(f"{source}: no {name}")
                return default
            for n, v in present:
                if not _is_integer(v) or not 0 < v <= _MAX_DIM:
                    raise CaptureError(f"{source}: {n} is {_one_line(json.dumps(v), 40)}, not an "
                                       f"integer in 1..{_MAX_DIM}")
            if any(v != present[0][1] for _, v in present):
                raise CaptureError(f"{source}: " + " and ".join(f"{n} {v}" for n, v in present) +
                                   " disagree")
            return int(present[0][1])
        self.vocab = field("vocab_size")
        self.hidden = field("hidden_size")
        self.layers = field("num_hidden_layers")
        self.heads = field("num_attention_heads")
        self.kv_heads = field("num_key_value_heads")
        self.head_dim = field("head_dim", default=max(self.hidden // self.heads, 1))
        self.inter = field("intermediate_size")
        self.experts = field("num_local_experts", "num_experts")
        self.top_k = field("num_experts_per_tok", "experts_per_token")
        self.context = field("max_position_embeddings", default=131072)
        if self.top_k > self.experts:
            raise CaptureError(f"{source}: {self.top_k} experts per token, but {self.experts} experts")


def stage_shape(config: _Config, stage: str, position: int) -> tuple:
    """The shape of one row of `stage` at `position` (model/stages.h's shape rules)."""
    c = config
    if not isinstance(stage, str) or stage not in _STAGE:
        raise CaptureError(f"capture: unknown stage {_quoted(stage)}")
    if not _is_integer(position) or position < 0:
        raise CaptureError(f"capture: stage {stage}: position {_quoted(position)} is not an integer >= 0")
    shape = _STAGE[stage][2]
    return {
        "hidden": (c.hidden,),
        "qkv": ((c.heads + 2 * c.kv_heads) * c.head_dim,),
        "q": (c.heads, c.head_dim),
        "kv": (c.kv_heads, c.head_dim),
        "keys": (c.heads, position + 2),
        "head_out": (c.heads * c.head_dim,),
        "experts": (c.experts,),
        "topk": (c.top_k,),
        "mlp1": (c.top_k, 2 * c.inter),
        "inter": (c.top_k, c.inter),
        "expert_hidden": (c.top_k, c.hidden),
        "vocab": (c.vocab,),
        "token": (1,),
    }[shape]


def _execution_order(config: _Config, layer: int, stage: str) -> int:
    if layer >= 0:
        return len(_PROLOGUE) + len(_LAYER_STAGES) * layer + _LAYER_STAGES.index(stage)
    if stage in _PROLOGUE:
        return _PROLOGUE.index(stage)
    return len(_PROLOGUE) + len(_LAYER_STAGES) * config.layers + _EPILOGUE.index(stage)


def _checkpoint_files(model_dir: str) -> list:
    index = os.path.join(model_dir, "model.safetensors.index.json")
    if os.path.lexists(index):
        weight_map = _read_json(index, "shard index")
        weight_map = weight_map.get("weight_map") if isinstance(weight_map, dict) else None
        if not isinstance(weight_map, dict):
            raise CaptureError(f"{index}: no weight_map object")
        names = set(weight_map.values())
        for n in names:
            if not isinstance(n, str) or not n or n in (".", "..") or "/" in n or "\0" in n:
                raise CaptureError(f"{index}: {_one_line(json.dumps(n), 80)} is not a file name "
                                   "in the checkpoint directory")
        return sorted(names)
    if os.path.exists(os.path.join(model_dir, "model.safetensors")):
        return ["model.safetensors"]
    return sorted(n for n in os.listdir(model_dir) if n.endswith(".safetensors"))


def _hash_file(path: str, h):
    """Feeds a regular file to the hash `h` (a FIFO or device is refused, not read)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError as e:
        raise CaptureError(f"{path}: cannot open the checkpoint file ({e.strerror})") from None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise CaptureError(f"{path}: the checkpoint file is not a regular file")
        for chunk in iter(lambda: f.read(1 << 24), b""):
            h.update(chunk)


def checkpoint_fingerprint(model_dir: str) -> str:
    """The checkpoint fingerprint of model/fingerprint.h ("xxh3-128:<32 hex>"), or "" when it
    cannot be had: computed with the xxhash module when it is installed, else taken from the
    .parity-fingerprint.json cache the C++ tools leave beside the checkpoint when every file's
    size, inode and times still match it. Without one, a diff checks the config only. A shard
    index or checkpoint file it cannot use raises CaptureError."""
    model_dir = _path(model_dir, "model directory")
    try:
        names = _checkpoint_files(model_dir)
    except OSError as e:
        raise CaptureError(f"{model_dir}: cannot list the checkpoint ({e.strerror})") from None
    if not names:
        return ""
    try:
        import xxhash  # optional
    except ImportError:
        xxhash = None
    if xxhash is not None and hasattr(xxhash, "xxh3_128"):
        whole = xxhash.xxh3_128()
        for name in sorted(names):
            h = xxhash.xxh3_128()
            _hash_file(os.path.join(model_dir, name), h)
            digest = h.intdigest()
            text = f"{digest >> 64:016x}{digest & ((1 << 64) - 1):016x}"
            whole.update(name.encode() + b"\0")
            whole.update(text.encode())
        d = whole.intdigest()
        return f"xxh3-128:{d >> 64:016x}{d & ((1 << 64) - 1):016x}"
    try:
        with open(os.path.join(model_dir, ".parity-fingerprint.json"), encoding="utf-8") as f:
            cache = json.load(f)
        by_name = {e["name"]: e for e in cache["files"]}
        if set(by_name) != set(names):
            return ""
        for name in names:
            st = os.stat(os.path.join(model_dir, name))
            e = by_name[name]
            if (e["size"], e["inode"], e["mtime_ns"], e["ctime_ns"]) != (
                    st.st_size, st.st_ino, st.st_mtime_ns, st.st_ctime_ns):
                return ""
        fp = cache.get("fingerprint", "")
        return fp if isinstance(fp, str) and fp.startswith("xxh3-128:") else ""
    except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError):
        return ""


def _to_numpy(values, what: str) -> np.ndarray:
    """A host NumPy array of any tensor: PyTorch tensors are detached and copied to the host
    (bfloat16 through float32, exactly). What cannot be one (ragged or too deeply nested lists,
    objects that refuse) raises CaptureError beginning with `what`."""
    try:
        if hasattr(values, "detach") and hasattr(values, "cpu"):  # a torch.Tensor, imported lazily
            t = values.detach().cpu()
            if str(t.dtype) == "torch.bfloat16":
                t = t.float()
            values = t.numpy()
        return np.asarray(values)
    except CaptureError:
        raise
    except Exception as e:  # noqa: BLE001 - numpy and tensors raise many kinds
        raise CaptureError(f"{what}: not an array of numbers ({type(e).__name__}: "
                           f"{_one_line(e, 120)})") from None


def _layout_text(layout: int) -> str:
    return "|".join(n for bit, n in _LAYOUT_NAMES.items() if layout & bit) or "DEFAULT"


def _guarded(records: bool):
    """Makes a method of Capture raise CaptureError alone, for whatever goes wrong inside it (a bad
    argument numpy or h5py trips over, a call with the wrong arguments, a failed write). With
    `records`, any failure is a refused record: close() will not write the capture."""
    def wrap(method):
        @functools.wraps(method)
        def call(self, *args, **kwargs):
            try:
                return method(self, *args, **kwargs)
            except BaseException as e:
                message = str(e) if isinstance(e, CaptureError) else (
                    f"capture {self.path or '(no path)'}: {method.__name__}() failed: "
                    f"{type(e).__name__}: {_one_line(e, 200)}")
                if records and self._refused is not None:
                    self._refused.append(message)
                if isinstance(e, CaptureError):
                    raise
                if not isinstance(e, Exception):  # KeyboardInterrupt, SystemExit: as they are
                    raise
                raise CaptureError(message) from e
        return call
    return wrap


class Capture:
    """A capture of one run of a port: open it for the checkpoint directory and the token ids at
    positions 0, 1, ... (the prompt; append_tokens() adds the tokens a port generates as it goes);
    record stage rows; close() writes the file (a context manager closes on success and abandons
    on an exception)."""

    # What a half-made Capture (its __init__ refused) holds: nothing to close.
    path = ""
    _file = None
    _tmp = None
    _refused = None

    @_guarded(records=False)
    def __init__(self, path, model_dir, tokens, port: str = "capture-python",
                 precision: str = "float32", device: str | None = None):
        self.path = _path(path, "output path")
        if not isinstance(precision, str) or precision not in _precision.PRESETS:
            raise CaptureError(f"capture {self.path}: precision {_quoted(precision)} is not a preset "
                               f"({', '.join(_precision.preset_names())})")
        for name, value in (("port", port), ("device", device)):
            if value is not None and not isinstance(value, str):
                raise CaptureError(f"capture {self.path}: the {name} is text, not {_quoted(value)}")
        model_dir = os.path.abspath(_path(model_dir, "model directory"))
        config_path = os.path.join(model_dir, "config.json")
        raw = _read_json(config_path, "config")
        if not isinstance(raw, dict):
            raise CaptureError(f"capture {self.path}: {config_path} is not a JSON object")
        self.config = _Config(raw, config_path)
        self._model_dir = model_dir
        self.tokens = []
        self.tokens = self._checked_tokens(tokens)
        if not self.tokens:
            raise CaptureError(f"capture {self.path}: no tokens")
        self._written = set()
        self._groups = {}  # (position, layer) -> its h5py group
        self._cache = {}   # layer -> cache rows recorded
        self._partial = {}
        self._refused = []
        if os.path.isdir(self.path) or (os.path.exists(self.path) and
                                        not stat.S_ISREG(os.stat(self.path).st_mode)):
            raise CaptureError(f"capture {self.path}: exists and is not a regular file")
        fingerprint = checkpoint_fingerprint(model_dir)
        if not fingerprint:
            try:
                import xxhash  # noqa: F401
                why = "no .safetensors files to hash"
            except ImportError:
                why = ("no xxhash module (Debian: python3-xxhash; pip: xxhash) and no valid "
                       ".parity-fingerprint.json beside the checkpoint (any gpt-oss-parity tool that "
                       "loads it writes one)")
            warnings.warn(f"capture {self.path}: no checkpoint fingerprint for {model_dir}: {why}; "
                          "the diff will check the config only", FingerprintWarning, stacklevel=3)
        # A temporary name of this capture's own (two captures of one path never share one; the
        # last to close is the file found there), created exclusively.
        tmp = f"{self.path}.tmp-{os.getpid()}-{secrets.token_hex(4)}"
        self._file = h5py.File(tmp, "w-", libver="latest", track_order=True)
        self._tmp = tmp
        try:
            self._write_meta(raw, port, precision, device, fingerprint)
        except BaseException:
            self.abandon()
            raise

    def _write_meta(self, raw: dict, port, precision: str, device, fingerprint: str):
        attrs = self._file.attrs
        self._str(attrs, "format", TRACE_FORMAT)
        attrs.create("format_version", np.int32(TRACE_FORMAT_VERSION))
        self._str(attrs, "backend", _one_line(port) if port else "capture-python")
        self._str(attrs, "precision", f"{precision}, as declared by the port")
        self._str(attrs, "config", json.dumps(raw, sort_keys=True))
        self._str(attrs, "checkpoint_fingerprint", fingerprint)
        self._str(attrs, "model_dir", self._model_dir)
        self._str(attrs, "tool_version", f"parity_capture.py {CAPTURE_VERSION}")
        self._str(attrs, "commit", "unknown")
        self._str(attrs, "device", json.dumps({"description": _one_line(device, 1000)} if device else {}))
        self._str(attrs, "created",
                  datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"))
        self._str(attrs, "precision_policy", json.dumps(_precision.policy(precision)))
        attrs.create("replay", np.int32(0))
        self._str(attrs, "run", json.dumps({"capture": {"api": "python", "precision": precision}}))
        self._str(attrs, "run_id", secrets.token_hex(16))

    def _checked_tokens(self, tokens) -> list:
        """Token ids following self.tokens, checked against the vocabulary and the context: one
        list of integers (a [1, n] batch of one is taken as its row)."""
        array = _to_numpy(tokens, f"capture {self.path}: token ids")
        if array.ndim > 1 and any(n != 1 for n in array.shape[:-1]):
            raise CaptureError(f"capture {self.path}: token ids are one list, not an array of shape "
                               f"{list(array.shape)}")
        if array.size and array.dtype.kind not in "iu":
            raise CaptureError(f"capture {self.path}: token ids are integers, not {array.dtype}")
        array = array.reshape(-1)
        if isinstance(tokens, (list, tuple)) and array.size:  # NumPy reads [True, 2] as integers
            ids = np.asarray(tokens, dtype=object).reshape(-1)
            odd = next((t for t in ids if not _is_integer(t)), None)
            if odd is not None:
                raise CaptureError(f"capture {self.path}: token ids are integers, not {_quoted(odd)}")
        first = len(self.tokens)
        if first + array.size > self.config.context:
            raise CaptureError(f"capture {self.path}: {first + array.size} tokens, past the context of "
                               f"{self._model_dir} ({self.config.context} positions)")
        bad = np.nonzero((array < 0) | (array >= self.config.vocab))[0]
        if bad.size:
            raise CaptureError(f"capture {self.path}: token id {array[bad[0]]} at position "
                               f"{first + bad[0]} is out of range for {self._model_dir} (vocabulary "
                               f"0..{self.config.vocab - 1})")
        return [int(t) for t in array]

    @_guarded(records=False)
    def append_tokens(self, tokens):
        """Appends token ids at the next positions (a port generating as it goes: record the
        generated token's position after appending it). The file's token list is written at
        close()."""
        if self._file is None:
            raise CaptureError(f"capture {self.path}: append_tokens() after close() or abandon()")
        self.tokens.extend(self._checked_tokens(tokens))

    @_guarded(records=True)
    def record_cache(self, layer: int, k, v, layout: int = 0):
        """Records the KV-cache rows of positions 0..n-1 of `layer` in one call: k (rotated keys)
        and v, each [n, n_kv_heads, head_dim] (k in ROPE_INTERLEAVED pairs with that layout). A
        capture with cache rows for every layer and stage rows only at positions n and later is
        judged at those positions alone: the reference takes this cache as its own and skips the
        prefix (long positions at the cost of one; parity-trace --candidate-trace)."""
        if self._file is None:
            raise CaptureError(f"capture {self.path}: record_cache() after close() or abandon()")
        c = self.config
        layer = self._integer("layer", layer, f"capture {self.path}: cache")
        layout = self._layout(layout, f"capture {self.path}: cache of layer {layer}")
        at = f"capture {self.path}: cache of layer {layer}"
        if not 0 <= layer < c.layers:
            self._refuse(f"{at}: the model has layers 0..{c.layers - 1}")
        if layout & ~ROPE_INTERLEAVED:
            self._refuse(f"{at}: layout {_layout_text(layout & ~ROPE_INTERLEAVED)} does not apply to "
                         "cache rows")
        if layer in self._cache:
            self._refuse(f"{at}: recorded twice")
        rows = []
        for name, values in (("k_rope", k), ("v", v)):
            a = _to_numpy(values, f"{at}: {name}")
            if a.dtype.kind != "f":
                self._refuse(f"{at}: {name} holds real values: give floats, not {a.dtype}")
            row = c.kv_heads * c.head_dim
            if a.size % row or a.size == 0:
                self._refuse(f"{at}: {name} has {a.size} values, not a whole number of rows of "
                             f"[{c.kv_heads}, {c.head_dim}]")
            if a.size // row > len(self.tokens):  # before anything is copied
                self._refuse(f"{at}: {a.size // row} rows, but the capture has {len(self.tokens)} tokens")
            a = a.reshape(-1, c.kv_heads, c.head_dim)
            if name == "k_rope" and layout & ROPE_INTERLEAVED:
                a = np.concatenate([a[..., 0::2], a[..., 1::2]], axis=-1)
            rows.append(a)
        if rows[0].shape != rows[1].shape:
            self._refuse(f"{at}: k_rope has {rows[0].shape[0]} rows, v {rows[1].shape[0]}")
        n = rows[0].shape[0]
        if self._cache and n != next(iter(self._cache.values())):
            self._refuse(f"{at}: {n} rows, but the layers recorded before have "
                         f"{next(iter(self._cache.values()))}: every layer caches the same positions")
        group = self._file.require_group("cache").require_group(f"layer_{layer}")
        for name, a in zip(("k_rope", "v"), rows):
            ds = group.create_dataset(name, data=a.astype(np.float64 if a.dtype == np.float64 else np.float32))
            self._ds_attr(ds, "layer", layer)
            self._ds_attr(ds, "first_position", 0)
        self._cache[layer] = n

    # -- writing -----------------------------------------------------------------------------

    @staticmethod
    def _str(attrs, name: str, value: str):
        data = value.encode("utf-8")
        attrs.create(name, np.array(data + b"\0", dtype=h5py.string_dtype("utf-8", len(data) + 1)))

    # A dataset's attributes through h5py's low-level API, with the scalar space and the types made
    # once: the high-level attrs.create() was half of a record's cost.
    _SCALAR = None

    @classmethod
    def _ds_attr(cls, ds, name: str, value):
        if cls._SCALAR is None:
            cls._SCALAR = h5py.h5s.create(h5py.h5s.SCALAR)
        if isinstance(value, str):
            data = np.array(value.encode("utf-8") + b"\0")
            t = h5py.h5t.C_S1.copy()
            t.set_size(data.itemsize)
            t.set_cset(h5py.h5t.CSET_UTF8)
            t.set_strpad(h5py.h5t.STR_NULLTERM)
        else:
            data, t = np.array(value, dtype=np.int32), h5py.h5t.STD_I32LE
        h5py.h5a.create(ds.id, name.encode(), t, cls._SCALAR).write(data, mtype=t)

    def _where(self, stage, position, layer, slot) -> str:
        s = f"capture {self.path}: stage {stage}"
        if layer != -1:
            s += f", layer {layer}"
        s += f", position {position}"
        if slot >= 0:
            s += f", slot {slot}"
        return s

    @staticmethod
    def _refuse(message: str):
        """Refuses a call (a refused record is counted by _guarded: close() will not write)."""
        raise CaptureError(message)

    def _integer(self, name: str, value, at: str) -> int:
        """An argument that is an exact integer (not a bool, float or string), as an int."""
        if not _is_integer(value):
            self._refuse(f"{at}: the {name} is an integer, not {_quoted(value)}")
        return int(value)

    def _layout(self, value, at: str) -> int:
        """A layout: flags of this module, combined with |."""
        layout = self._integer("layout", value, at)
        known = sum(_LAYOUT_NAMES)
        if layout < 0 or layout & ~known:
            self._refuse(f"{at}: layout {layout:#x} has bits that are no layout flag "
                         f"({_layout_text(known)})")
        return layout

    @_guarded(records=True)
    def record(self, stage: str, position: int, layer: int, values, slot: int = -1,
               layout: int = 0):
        """Records one stage row (or one expert slot, or one qkv part). `layer` is -1 for the
        model-scope stages; `slot` an expert slot of mlp1/swiglu/mlp2, or -1 for all of them.
        Raises CaptureError (and the capture will not be written) on anything that does not fit
        the stage list."""
        if self._file is None:
            raise CaptureError(f"capture {self.path}: record() after close() or abandon()")
        c = self.config
        name = stage if isinstance(stage, str) and stage in _STAGE else "?"
        at = f"capture {self.path}: stage {name}"
        position = self._integer("position", position, at)
        layer = self._integer("layer", layer, at)
        slot = self._integer("slot", slot, at)
        if name == "?":
            self._refuse(f"capture {self.path}: unknown stage {_quoted(stage)} (position {position}, "
                         f"layer {layer}); the stages are {', '.join(s[0] for s in STAGES)}")
        _, scope, _, kind = _STAGE[stage]
        at = self._where(stage, position, layer, slot)
        layout = self._layout(layout, at)
        if not 0 <= position < len(self.tokens):
            self._refuse(f"{at}: the capture has positions 0..{len(self.tokens) - 1} (one per token)")
        if scope == "model" and layer != -1:
            self._refuse(f"{at}: {stage} is a model-scope stage: record it with layer -1")
        if scope != "model" and not 0 <= layer < c.layers:
            self._refuse(f"{at}: the model has layers 0..{c.layers - 1}")
        if slot != -1 and (scope != "expert" or not 0 <= slot < c.top_k):
            self._refuse(f"{at}: expert slots are 0..{c.top_k - 1} (or -1 for all)" if scope == "expert"
                         else f"{at}: only mlp1, swiglu and mlp2 have expert slots; give slot -1")
        allowed = _LAYOUTS_FOR.get(stage, 0)
        if layout & ~allowed:
            self._refuse(f"{at}: layout {_layout_text(layout & ~allowed)} does not apply to stage {stage}")
        parts = layout & _QKV_PARTS
        if parts & (parts - 1):
            self._refuse(f"{at}: one qkv part per record ({_layout_text(parts)})")
        if parts == QKV_V and layout & ROPE_INTERLEAVED:
            self._refuse(f"{at}: ROPE_INTERLEAVED does not apply to the v part (v is not rotated)")
        if layout & SINK_FIRST and layout & NO_SINK:
            self._refuse(f"{at}: SINK_FIRST and NO_SINK exclude each other")
        array = _to_numpy(values, f"{at}: values")
        if kind == "index":
            if array.dtype.kind not in "iu":
                self._refuse(f"{at}: {stage} holds indices: give integers, not {array.dtype}")
        elif array.dtype.kind != "f":
            self._refuse(f"{at}: {stage} holds real values: give floats, not {array.dtype}")

        shape = stage_shape(c, stage, position)
        row = int(np.prod(shape))
        keys = position + 1
        expected, what, part, parts_n, offset = row, f"{list(shape)}", 0, 1, 0
        if slot >= 0:
            expected, what, part, parts_n, offset = shape[1], f"[{shape[1]}] (one slot of {list(shape)})", slot, shape[0], slot * shape[1]
        elif parts:
            q, kv = c.heads * c.head_dim, c.kv_heads * c.head_dim
            part = {QKV_Q: 0, QKV_K: 1, QKV_V: 2}[parts]
            expected = q if part == 0 else kv
            offset = (0, q, q + kv)[part]
            parts_n = 3
            what = f"[{expected}] (the {'qkv'[part]} part of qkv)"
        elif layout & NO_SINK:
            expected, what = c.heads * keys, f"[{c.heads}, {keys}] (keys 0..{position} without the sink)"
        if array.size != expected:
            self._refuse(f"{at}: {array.size} values of shape {list(array.shape)}, but the row is "
                         f"{what} = {expected} values")
        key = (position, layer, stage)
        if key in self._written:
            self._refuse(f"{at}: recorded twice (each position, layer and stage is recorded once)")
        pending = self._partial.get(key)
        if parts_n == 1 and pending is not None:
            self._refuse(f"{at}: recorded whole after some of its slots or parts were recorded")
        if pending is not None and len(pending[1]) != parts_n:
            self._refuse(f"{at}: mixes expert slots and qkv parts")
        if pending is not None and pending[1][part]:
            self._refuse(f"{at}: {'this slot' if slot >= 0 else 'this part of qkv'} recorded twice")

        if kind == "index":  # checked before the cast: a uint64 past int64 must not wrap
            limit = c.experts if stage == "topk_idx" else c.vocab
            flat = array.reshape(-1)
            bad = np.nonzero((flat < 0) | (flat >= limit))[0]
            if bad.size:
                self._refuse(f"{at}: element {bad[0]} is {flat[bad[0]]}, not an index below {limit}")
        v = array.reshape(-1).astype(np.float64 if kind == "real" else np.int64)
        d = c.head_dim
        if layout & ROPE_INTERLEAVED:
            end = v.size
            if stage == "qkv" and not parts:
                end = (c.heads + c.kv_heads) * d
            heads = v[:end].reshape(-1, d)
            v[:end] = np.concatenate([heads[:, 0::2], heads[:, 1::2]], axis=1).reshape(-1)
        if layout & SINK_FIRST:
            m = v.reshape(c.heads, keys + 1)
            v = np.concatenate([m[:, 1:], m[:, :1]], axis=1).reshape(-1)
        if layout & NO_SINK:
            m = v.reshape(c.heads, keys)
            v = np.concatenate([m, 1.0 - m.sum(axis=1, keepdims=True)], axis=1).reshape(-1)
        if layout & GATE_UP_HALVES:
            m = v.reshape(-1, 2, c.inter)
            v = np.stack([m[:, 0, :], m[:, 1, :]], axis=2).reshape(-1)
        f64 = array.dtype == np.float64
        if parts_n == 1:
            self._write(position, layer, stage, v, f64, layout)
            return
        if pending is None:
            pending = self._partial[key] = [np.zeros(row), [False] * parts_n, True]
        pending[0][offset:offset + v.size] = v
        pending[1][part] = True
        pending[2] = pending[2] and f64
        if all(pending[1]):
            del self._partial[key]
            self._write(position, layer, stage, pending[0], pending[2])

    def _write(self, position, layer, stage, v, f64, layout=0):
        shape = stage_shape(self.config, stage, position)
        kind = _STAGE[stage][3]
        dtype = np.int32 if kind == "index" else (np.float64 if f64 else np.float32)
        group = self._groups.get((position, layer))
        if group is None:
            pos_name, scope_name = f"pos_{position}", "model" if layer == -1 else f"layer_{layer}"
            if pos_name not in self._file:
                self._file.create_group(pos_name, track_order=True)
            pos_group = self._file[pos_name]
            if scope_name not in pos_group:
                pos_group.create_group(scope_name, track_order=True)
            group = self._groups[(position, layer)] = pos_group[scope_name]
        ds = group.create_dataset(stage, data=v.reshape(shape).astype(dtype))
        self._ds_attr(ds, "stage", stage)
        self._ds_attr(ds, "layer", layer)
        self._ds_attr(ds, "position", position)
        self._ds_attr(ds, "order", _execution_order(self.config, layer, stage))
        if layout:  # the port's layout (NO_SINK: the att row's sink column is derived)
            self._ds_attr(ds, "layout", _layout_text(layout))
        self._written.add((position, layer, stage))

    @_guarded(records=False)
    def close(self):
        """Writes the capture under its name. Refuses (writing nothing) when a record was refused
        or a row was left incomplete."""
        if self._file is None:
            raise CaptureError(f"capture {self.path}: close() after close() or abandon()")
        try:
            if self._refused:
                raise CaptureError(f"capture {self.path}: not written: {len(self._refused)} record(s) "
                                   f"were refused; the first: {self._refused[0]}")
            if self._cache and len(self._cache) != self.config.layers:
                missing = [L for L in range(self.config.layers) if L not in self._cache][0]
                raise CaptureError(f"capture {self.path}: cache rows of layer {missing} never recorded "
                                   f"(the other layers' are); not written")
            inside = sorted(p for p, _, _ in self._written if self._cache and p < next(iter(self._cache.values())))
            if inside:
                raise CaptureError(f"capture {self.path}: rows at position {inside[0]} lie inside the cache "
                                   f"prefix 0..{next(iter(self._cache.values())) - 1}: record a position's "
                                   "stage rows or its cache rows, not both; not written")
            if self._partial:
                (position, layer, stage), (_, have, _) = next(iter(self._partial.items()))
                missing = [i for i, h in enumerate(have) if not h]
                what = (f"expert slot(s) {', '.join(map(str, missing))}" if _STAGE[stage][1] == "expert"
                        else f"the {', '.join('qkv'[i] for i in missing)} part(s)")
                raise CaptureError(f"{self._where(stage, position, layer, -1)}: incomplete: {what} never "
                                   f"recorded ({len(self._partial)} incomplete row(s) in all); not written")
            self._file.attrs.create("tokens", np.asarray(self.tokens, dtype=np.int32))
            self._file.attrs.create("positions", np.arange(len(self.tokens), dtype=np.int32))
            self._file.close()
            self._file = None
            os.replace(self._tmp, self.path)
            self._tmp = None
        finally:
            self.abandon()

    @_guarded(records=False)
    def abandon(self):
        """Drops the capture: nothing is written (the temporary file is removed)."""
        try:
            if self._file is not None:
                try:
                    self._file.close()
                finally:
                    self._file = None
        finally:
            tmp, self._tmp = self._tmp, None
            if tmp is not None and os.path.lexists(tmp):
                os.remove(tmp)

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            self.close()
        else:
            self.abandon()
        return False

    def __del__(self):
        try:
            self.abandon()
        except Exception:  # interpreter shutdown
            pass
