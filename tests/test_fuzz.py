"""Fuzz test: every public function of attngeom on hostile input, in a worker subprocess.

Each public function (``attngeom.__all__``: functions and the classes that compute, not the
result dataclasses) has a hypothesis strategy in ``SPECS`` below; a public function without
one fails ``test_every_public_function_has_a_strategy``, so new functions cannot escape.
Inputs mix well-shaped operands with hostile ones: random shapes (0-d, empty), magnitudes
from 1e-300 to 1e300, arrays scaled to 0.9 of their dtype's largest number (float32 near
3e38), NaN and inf, float16/32/64, int and bool dtypes, Fortran-ordered, strided, reversed
and broadcast (read-only, zero-stride) views, one-element masks broadcast to every (query,
key) pair, sample grids grown long (up to 32 points) or holding a NaN point, scalars at the
extremes (scale = 1e308), None, wrong types and huge integers (10**9 iterations, 2**63).

Every call runs in a worker subprocess with faulthandler enabled; the cases are pickled to
it through a pipe, many per process. Outcomes:

- ``return``: a result, finite wherever the input was finite (clean);
- ``error``: ValueError or TypeError whose message names an argument, or an ImportError that
  says which optional dependency to install (clean);
- ``unnamed-error``: ValueError or TypeError that names none of the arguments (bad);
- ``exception:<Type>``: any other exception type (bad), except a MemoryError for a size
  within the library's stated limit (``MAX_ARRAY_BYTES``), which the worker's capped address
  space may refuse (clean);
- ``non-finite:nan`` / ``non-finite:inf``: NaN (or else inf) in the result of a finite
  input (bad: a finite answer, or a ValueError when the true answer overflows);
- ``crash`` / ``timeout``: the worker died or hung; a new one takes over (bad).

The test asserts that no case is bad, naming the function and the input.

Bounded for ``make test``: ``ATTNGEOM_FUZZ_EXAMPLES`` examples per function (default 20),
``ATTNGEOM_FUZZ_TIMEOUT`` seconds per call (default 10). The draws are derandomized
(the same cases on every run) unless ``ATTNGEOM_FUZZ_RANDOM=1``; ``ATTNGEOM_FUZZ_SHRINK=1``
lets hypothesis shrink a failure to a minimal input (slow when the worker crashes).

Campaign mode prints the counts instead of failing::

    python tests/test_fuzz.py --examples 200 --report [--only softmax_attention ...]
"""
from __future__ import annotations

import dataclasses
import faulthandler
import inspect
import io
import json
import math
import os
import pickle
import re
import select
import struct
import subprocess
import sys
import tempfile
import time
import warnings
from collections import Counter, defaultdict

import numpy as np
import pytest

EXAMPLES = int(os.environ.get("ATTNGEOM_FUZZ_EXAMPLES", "20"))
TIMEOUT = float(os.environ.get("ATTNGEOM_FUZZ_TIMEOUT", "10"))
RANDOM = os.environ.get("ATTNGEOM_FUZZ_RANDOM", "") not in ("", "0")
SHRINK = os.environ.get("ATTNGEOM_FUZZ_SHRINK", "") not in ("", "0")
# The worker's address space is capped so that an absurd size (a hang or a multi-GB
# allocation in the reproducers) fails inside the worker instead of taking the
# memory of a shared machine. Not under ASan, which reserves terabytes of shadow memory;
# there the allocator's own cap applies (see Worker.start).
MEMORY_LIMIT = int(os.environ.get("ATTNGEOM_FUZZ_MEMORY_MB", "4096")) << 20

CLEAN = ("return", "error")


# --------------------------------------------------------------------------------------
# Case values that must be rebuilt in the worker: pickling an array makes a contiguous
# copy, so the layout is applied on the worker's side.


class Arr:
    """An array and the memory layout it is given in the worker."""

    def __init__(self, data, layout="C", note=""):
        self.data, self.layout, self.note = data, layout, note

    def build(self):
        a = self.data
        if a.ndim == 0 or a.size == 0:
            return a
        if self.layout == "F":
            return np.asfortranarray(a)
        if self.layout == "strided":  # every other element of a twice-as-wide array
            wide = np.repeat(a, 2, axis=-1)
            wide[..., 1::2] = 12345  # poison: a kernel that ignores the stride reads these
            return wide[..., ::2]
        if self.layout == "reversed":
            return np.ascontiguousarray(a[..., ::-1])[..., ::-1]
        if self.layout == "broadcast":  # zero stride on the first axis, read-only
            return np.broadcast_to(a[:1], a.shape)
        return a

    def __repr__(self):
        a = self.data
        text = f"array({a.dtype}, shape={a.shape}, {self.layout}"
        if self.note:
            text += f", {self.note}"
        if a.size and a.size <= 4:
            text += f", values={a.ravel().tolist()}"
        return text + ")"


class File:
    """Bytes written to a temporary file in the worker; the call gets its path."""

    def __init__(self, content: bytes, suffix=".safetensors", note=""):
        self.content, self.suffix, self.note = content, suffix, note

    def __repr__(self):
        return f"File({self.note or len(self.content)} bytes{self.suffix})"


class Probe:
    """A probe callable for recover_keys: head_probe(k, v), or a broken one."""

    def __init__(self, k=None, v=None, broken=None):
        self.k, self.v, self.broken = k, v, broken

    def __repr__(self):
        return f"Probe(broken={self.broken!r})" if self.broken else f"head_probe({self.k!r}, {self.v!r})"


class PlantedModel:
    """The folder of a small planted-induction GPT-2, written once in the worker."""

    def __repr__(self):
        return "PlantedModel()"


class TinyModel:
    """The folder of a tiny random checkpoint of a mixture-of-experts or multi-head latent
    attention layout ("mixtral", "deepseek_v2"), written once in the worker with NumPy."""

    def __init__(self, kind):
        self.kind = kind

    def __repr__(self):
        return f"TinyModel({self.kind!r})"


# config.json of the TinyModel checkpoints: vocabulary 8, d_model 8, 2 layers, 2 heads.
TINY_CONFIGS = {
    "mixtral": dict(model_type="mixtral", vocab_size=8, hidden_size=8, intermediate_size=8, num_hidden_layers=2,
                    num_attention_heads=2, num_key_value_heads=1, num_local_experts=3, num_experts_per_tok=2,
                    rope_theta=100.0),
    "deepseek_v2": dict(model_type="deepseek_v2", vocab_size=8, hidden_size=8, intermediate_size=8,
                        num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2, q_lora_rank=4,
                        kv_lora_rank=3, qk_nope_head_dim=2, qk_rope_head_dim=2, v_head_dim=2, n_routed_experts=4,
                        num_experts_per_tok=2, n_shared_experts=1, moe_intermediate_size=4, first_k_dense_replace=1,
                        routed_scaling_factor=1.5, topk_method="group_limited_greedy", n_group=2, topk_group=1,
                        rope_parameters={"rope_type": "default", "rope_theta": 100.0}),
}


def _tiny_tensors(cfg):
    """Tensor shapes (out, in) of a TinyModel checkpoint, by name."""
    d, V, H, ff = cfg["hidden_size"], cfg["vocab_size"], cfg["num_attention_heads"], cfg["intermediate_size"]
    t = {"model.embed_tokens.weight": (V, d), "model.norm.weight": (d,), "lm_head.weight": (V, d)}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        t[p + "input_layernorm.weight"] = t[p + "post_attention_layernorm.weight"] = (d,)
        a = p + "self_attn."
        if cfg["model_type"] == "mixtral":
            dh, K, E = d // H, cfg["num_key_value_heads"], cfg["num_local_experts"]
            t.update({a + "q_proj.weight": (H * dh, d), a + "k_proj.weight": (K * dh, d),
                      a + "v_proj.weight": (K * dh, d), a + "o_proj.weight": (d, H * dh),
                      p + "block_sparse_moe.gate.weight": (E, d)})
            for e in range(E):
                x = f"{p}block_sparse_moe.experts.{e}."
                t.update({x + "w1.weight": (ff, d), x + "w3.weight": (ff, d), x + "w2.weight": (d, ff)})
            continue
        rq, rc, nope, rope, dv = (cfg[k] for k in ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim",
                                                    "qk_rope_head_dim", "v_head_dim"))
        t.update({a + "q_a_proj.weight": (rq, d), a + "q_a_layernorm.weight": (rq,),
                  a + "q_b_proj.weight": (H * (nope + rope), rq), a + "kv_a_proj_with_mqa.weight": (rc + rope, d),
                  a + "kv_a_layernorm.weight": (rc,), a + "kv_b_proj.weight": (H * (nope + dv), rc),
                  a + "o_proj.weight": (d, H * dv)})
        if i < cfg["first_k_dense_replace"]:
            t.update({p + "mlp.gate_proj.weight": (ff, d), p + "mlp.up_proj.weight": (ff, d),
                      p + "mlp.down_proj.weight": (d, ff)})
            continue
        f, E, fs = cfg["moe_intermediate_size"], cfg["n_routed_experts"], cfg["moe_intermediate_size"]
        t[p + "mlp.gate.weight"] = (E, d)
        for e in range(E):
            x = f"{p}mlp.experts.{e}."
            t.update({x + "gate_proj.weight": (f, d), x + "up_proj.weight": (f, d), x + "down_proj.weight": (d, f)})
        x = p + "mlp.shared_experts."
        t.update({x + "gate_proj.weight": (fs, d), x + "up_proj.weight": (fs, d), x + "down_proj.weight": (d, fs)})
    return t


def _write_tiny(folder, kind):
    import attngeom as ag

    cfg = TINY_CONFIGS[kind]
    rng = np.random.default_rng(0)
    tensors = {name: (np.ones(shape) + 0.1 * rng.standard_normal(shape) if len(shape) == 1
                      else 0.5 * rng.standard_normal(shape)).astype(np.float32)
               for name, shape in _tiny_tensors(cfg).items()}
    os.makedirs(folder)
    ag.models.write_safetensors(os.path.join(folder, "model.safetensors"), tensors)
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(cfg, f)


class NewPath:
    """A path in the worker's temporary folder that does not exist yet (a store to write)."""

    def __repr__(self):
        return "NewPath()"


class Opaque:
    """An object of no type any function accepts."""

    def __repr__(self):
        return "Opaque()"


def _build(x, tmpdir):
    if isinstance(x, Arr):
        return x.build()
    if isinstance(x, File):
        fd, path = tempfile.mkstemp(suffix=x.suffix, dir=tmpdir)
        with os.fdopen(fd, "wb") as f:
            f.write(x.content)
        return path
    if isinstance(x, Probe):
        import attngeom as ag

        if x.broken == "wrong_shape":
            return lambda u, tau: (np.zeros(3), np.zeros(2))
        if x.broken == "nan":
            return lambda u, tau: (np.full((len(u), len(tau)), np.nan), np.full((len(u), len(tau), 1), np.nan))
        if x.broken == "raises":
            def probe(u, tau):
                raise ValueError("probe: refused")
            return probe
        return ag.head_probe(_build(x.k, tmpdir), _build(x.v, tmpdir))
    if isinstance(x, PlantedModel):
        import attngeom as ag

        folder = os.path.join(tmpdir, "planted")
        if not os.path.isdir(folder):
            ag.models.planted_induction_model(folder, vocab_size=8, n_heads=2, d_head=16, n_positions=12)
        return folder
    if isinstance(x, TinyModel):
        folder = os.path.join(tmpdir, x.kind)
        if not os.path.isdir(folder):
            _write_tiny(folder, x.kind)
        return folder
    if isinstance(x, NewPath):
        return tempfile.mkdtemp(dir=tmpdir) + "/store"
    if isinstance(x, list):
        return [_build(e, tmpdir) for e in x]
    if isinstance(x, tuple):
        return tuple(_build(e, tmpdir) for e in x)
    if isinstance(x, dict):
        return {k: _build(e, tmpdir) for k, e in x.items()}
    return x


def describe(args, kwargs):
    parts = [repr(a) for a in args] + [f"{k}={v!r}" for k, v in kwargs.items()]
    text = ", ".join(parts)
    return text if len(text) < 600 else text[:600] + "..."


# --------------------------------------------------------------------------------------
# Finiteness of inputs and outputs


def _values(x, depth=0):
    """Numbers and float/complex arrays inside x (containers, dataclasses, plain objects)."""
    if depth > 4:
        return
    if isinstance(x, np.ndarray):
        if x.dtype.kind in "fc":
            yield x
        elif x.dtype == object:
            for e in x.ravel()[:1000]:
                yield from _values(e, depth + 1)
    elif isinstance(x, (bool, np.bool_, int, np.integer, str, bytes)) or x is None:
        return
    elif isinstance(x, (float, complex, np.floating, np.complexfloating)):
        yield np.asarray(x)
    elif isinstance(x, (list, tuple)):
        for e in x[:1000]:
            yield from _values(e, depth + 1)
    elif isinstance(x, dict):
        for e in list(x.values())[:1000]:
            yield from _values(e, depth + 1)
    elif dataclasses.is_dataclass(x) and not isinstance(x, type):
        for f in dataclasses.fields(x):
            yield from _values(getattr(x, f.name), depth + 1)
    elif hasattr(x, "__dict__") and not callable(x) and not inspect.ismodule(x):
        for e in vars(x).values():
            yield from _values(e, depth + 1)


def _finite(x):
    return all(bool(np.all(np.isfinite(a))) for a in _values(x))


# Results that may hold inf or NaN for finite input by definition, per function: the field
# and why. Anything else non-finite from finite input is a bad outcome.
def _only_minus_inf(x):
    """True when every non-finite value in x is -inf (a log of zero)."""
    return all(bool(np.all(np.isfinite(a) | (np.real(a) == -np.inf))) for a in _values(x))


def _finite_except(*fields):
    """True when every field of the result except `fields` is finite and those hold no NaN
    (they may be +-inf: documented overflow or an infinite ratio)."""

    def check(out):
        names = getattr(out, "_fields", ())
        for i, value in enumerate(out):
            free = i < len(names) and names[i] in fields
            if not (_finite(value) or (free and not any(bool(np.any(np.isnan(a))) for a in _values(value)))):
                return False
        return True

    return check


NONFINITE_ALLOWED = {
    # A fully masked row (mask or causal alignment hiding every key) has log Z = -inf,
    # documented (its output row is zeros).
    "softmax_attention": ("log Z of a fully masked row is -inf", _only_minus_inf),
    "kernel_attention": ("log Z of a fully masked row is -inf", _only_minus_inf),
    "laplace_radon_attention": ("log Z of a fully masked row is -inf", _only_minus_inf),
    "random_feature_attention": ("log Z of a query that sees no key (causal alignment) is -inf", _only_minus_inf),
    # Z, its variance and N = Z y overflow where the partition sum is beyond float64; log_Z
    # and y are the exact fields (documented).
    "sampled_attention": ("Z, Z_variance and N overflow with the partition sum",
                          _finite_except("Z", "Z_variance", "N")),
    # log f(x) of the Gaussian (alpha = 2) lies below the float range beyond |x| ~ 2.7e154
    # sqrt(c): -inf there, documented (the density itself is 0).
    "stable_density": ("log f(x) below the float range is -inf", _only_minus_inf),
    # Problems of a batch have their own orders: a problem of lower order than the batch's
    # largest is padded with NaN beyond its order (a single problem never is).
    "fit_exponential_sum": ("nodes beyond a problem's order in a batch are NaN padding", lambda out: (
        all(_finite(getattr(out, f.name)) for f in dataclasses.fields(out) if f.name != "nodes")
        and np.array_equal(np.isnan(out.nodes), np.arange(out.nodes.shape[-1]) >= np.asarray(out.order)[..., None])
        and np.ndim(out.order) > 0)),
    # The gap ratio of a zero or empty J (rank 0 exactly, no singular value above zero) is inf.
    "numerical_rank": ("the gap ratio of a zero or empty J is inf",
                       lambda out: out.rank == 0 and _finite((out.singular_values,)) and out.gap_ratio == math.inf),
}


# --------------------------------------------------------------------------------------
# The worker: reads (name, args, kwargs) pickles from stdin, answers (outcome, detail).


def _call_target(name):
    import attngeom as ag

    if name == "set_num_threads":
        # The thread count is process state: run a parallel kernel under it (a bad count
        # used to crash only there) and put the previous count back for the next case.
        def call(n):
            before = ag.get_num_threads()
            try:
                ag.set_num_threads(n)
                q = np.ones((4, 64, 8))
                return ag.softmax_attention(q, q, q)
            finally:
                ag.set_num_threads(before)
        return call
    if name == "TiltCoverage":
        def call(dim, updates, result_kwargs):
            acc = ag.TiltCoverage(dim)
            for u in updates:
                acc.update(u)
            other = ag.TiltCoverage(dim)
            acc.merge(other)
            return acc.result(**result_kwargs)
        return call
    if name == "Model":
        def call(path, token_ids):
            return ag.load_model(path).forward(token_ids)
        return call
    if name == "Subspace":
        def call(basis, kwargs, x):
            s = ag.Subspace(basis, **kwargs)
            return (s.dim, s.ambient_dim, s.basis(), s.complement_basis(), s.project(x), s.residual(x),
                    s.contains(x), s.principal_angles(s.complement()), s.distance(s))
        return call
    if name in ("_segfault", "_nan_from_finite", "_unnamed_error"):
        return globals()[name]
    if name == "show_config":
        return lambda *a, **k: ag.show_config(*a, **k)
    if name.startswith("models."):
        return getattr(ag.models, name[len("models."):])
    return getattr(ag, name)


def _argument_names(name, fn, kwargs):
    names = set(kwargs)
    try:
        names |= set(inspect.signature(fn).parameters) - {"args", "kwargs", "params"}
    except (TypeError, ValueError):
        pass
    if name in ("TiltCoverage", "Subspace", "set_num_threads"):
        import attngeom as ag
        target = {"TiltCoverage": ag.TiltCoverage, "Subspace": ag.Subspace, "set_num_threads": ag.set_num_threads}[name]
        names |= set(inspect.signature(target).parameters)
        # The methods the call goes through, and their arguments.
        if name == "TiltCoverage":
            names |= {"u", "W_K", "rtol", "centered", "other", "update", "merge", "result"}
        if name == "Subspace":
            names |= {"x", "other", "atol", "rtol", "project", "residual", "contains", "principal_angles"}
    return names


def _names_an_argument(message, names, values=()):
    """Whether the message names one of the arguments (``d``, ``d_0`` and ``d[0]`` name d),
    or quotes a string argument such as a file's path (readers name the file)."""
    if not names:
        return True
    if any(len(v) > 3 and v in message for v in values):
        return True
    return any(re.search(rf"(?<![A-Za-z0-9_]){re.escape(n)}(_\d+)?(?![A-Za-z0-9_])", message) for n in names)


_UNITS = {"B": 0, "KiB": 10, "MiB": 20, "GiB": 30, "TiB": 40, "PiB": 50, "EiB": 60}


def _within_size_limit(message: str) -> bool:
    """Whether NumPy's "Unable to allocate 7.45 GiB ..." asked for no more than the
    library's MAX_ARRAY_BYTES (the size every function checks before allocating)."""
    from attngeom._operands import MAX_ARRAY_BYTES

    m = re.search(r"Unable to allocate ([0-9.]+) (B|KiB|MiB|GiB|TiB|PiB|EiB)", message)
    return bool(m) and float(m.group(1)) * 2 ** _UNITS[m.group(2)] <= MAX_ARRAY_BYTES


def _run_case(name, args, kwargs, tmpdir):
    try:
        fn = _call_target(name)
        args, kwargs = _build(args, tmpdir), _build(kwargs, tmpdir)
    except Exception as e:  # a broken spec, not a library outcome
        return "harness-error", f"{type(e).__name__}: {e}"
    finite_in = _finite((args, kwargs))
    faulthandler.dump_traceback_later(TIMEOUT, exit=True)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out = fn(*args, **kwargs)
    except (ValueError, TypeError) as e:
        message = str(e)
        strings = [a for a in list(args) + list(kwargs.values()) if isinstance(a, str)]
        if _names_an_argument(message, _argument_names(name, fn, kwargs), strings):
            return "error", f"{type(e).__name__}: {message[:300]}"
        return "unnamed-error", f"{type(e).__name__}: {message[:300]}"
    except ImportError as e:
        # An optional dependency this environment lacks (zarr for activation stores, say): the
        # library's ImportError names what to install, the right answer there.
        if "pip install" in str(e):
            return "error", f"ImportError of a missing optional dependency: {str(e)[:300]}"
        return "exception:ImportError", f"ImportError: {str(e)[:300]}"
    except MemoryError as e:
        # A size within the library's stated limit that the worker's capped address space
        # cannot hold is the machine's answer, not a finding; beyond the limit it is one.
        if _within_size_limit(str(e)):
            return "error", f"MemoryError within the size limit: {str(e)[:300]}"
        return "exception:MemoryError", f"MemoryError: {str(e)[:300]}"
    except BaseException as e:  # noqa: B902 - every other type is the finding
        return f"exception:{type(e).__name__}", f"{type(e).__name__}: {str(e)[:300]}"
    finally:
        faulthandler.cancel_dump_traceback_later()
    try:
        finite_out = _finite(out)
    except Exception as e:
        return "harness-error", f"inspecting the result: {type(e).__name__}: {e}"
    if finite_in and not finite_out:
        if name in NONFINITE_ALLOWED and NONFINITE_ALLOWED[name][1](out):
            return "return", NONFINITE_ALLOWED[name][0]
        kind = "nan" if any(bool(np.any(np.isnan(a))) for a in _values(out)) else "inf"
        return f"non-finite:{kind}", f"{'NaN' if kind == 'nan' else 'inf'} in the result of a finite input"
    return "return", ""


def _recv(stream):
    header = stream.read(4)
    if len(header) < 4:
        return None
    (size,) = struct.unpack("<I", header)
    return pickle.loads(stream.read(size))


def _send(stream, obj):
    data = pickle.dumps(obj, protocol=4)
    stream.write(struct.pack("<I", len(data)) + data)
    stream.flush()


def worker_main():
    # The protocol owns the real stdout; anything the library prints goes to stderr.
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    inp = sys.stdin.buffer
    faulthandler.enable()
    sys.modules.setdefault("test_fuzz", sys.modules[__name__])
    if "asan" not in os.environ.get("LD_PRELOAD", ""):
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))
    import attngeom  # noqa: F401 - imported once, before the first case

    with tempfile.TemporaryDirectory() as tmpdir:
        while True:
            case = _recv(inp)
            if case is None:
                return
            name, args, kwargs = case
            print(f"--- case {name}", file=sys.stderr, flush=True)
            _send(out, _run_case(name, args, kwargs, tmpdir))


class Worker:
    """One worker subprocess at a time; a new one is started after a crash or a hang."""

    def __init__(self):
        self.proc = None
        self.log = None
        self.started = 0

    def start(self):
        env = dict(os.environ)
        env.setdefault("OMP_NUM_THREADS", "2")
        if "asan" in env.get("LD_PRELOAD", ""):
            # Without the address-space cap, ASan's allocator refuses absurd sizes itself
            # (MemoryError in the worker instead of exhausting the machine).
            env["ASAN_OPTIONS"] = env.get("ASAN_OPTIONS", "") + ":allocator_may_return_null=1:max_allocation_size_mb=4096"
        self.log = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(
            [sys.executable, "-X", "faulthandler", os.path.abspath(__file__), "--worker"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, env=env,
        )
        self.started += 1

    def close(self):
        if self.proc is not None:
            try:
                self.proc.stdin.close()
                self.proc.wait(timeout=10)
            except Exception:
                self.proc.kill()
                self.proc.wait()
            self.proc = None

    def _stderr_since(self, offset, limit=4000):
        self.log.seek(offset)
        text = self.log.read().decode("utf-8", "replace")
        self.log.seek(0, io.SEEK_END)
        return text if len(text) <= limit else "...\n" + text[-limit:]

    def run(self, name, args, kwargs):
        if self.proc is None or self.proc.poll() is not None:
            self.start()
        self.log.seek(0, io.SEEK_END)
        offset = self.log.tell()
        try:
            _send(self.proc.stdin, (name, args, kwargs))
        except BrokenPipeError:
            pass
        # The worker's faulthandler exits after TIMEOUT with the hung traceback; the
        # margin covers its startup and a slow interpreter (ASan).
        ready, _, _ = select.select([self.proc.stdout], [], [], TIMEOUT + 30)
        answer = _recv(self.proc.stdout) if ready else None
        if answer is not None:
            return answer
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        code = self.proc.returncode
        self.proc = None
        log = self._stderr_since(offset)
        if not ready or "Timeout (" in log:
            return "timeout", f"no answer in {TIMEOUT:g} s\n{log}"
        how = f"signal {-code}" if code < 0 else f"exit status {code}"
        return "crash", f"worker died ({how})\n{log}"


# --------------------------------------------------------------------------------------
# Strategies. Each spec is a function of a generator ``g`` that draws one call: the
# arguments are well shaped most of the time (so the call reaches the numerics) and
# hostile otherwise.

EXTREME_FLOATS = [0.0, -1.0, 1.0, 2.0, 0.5, 1e-300, 5e-324, 1e308, -1e308, 1e-8, 1e8, 1e39,
                  math.inf, -math.inf, math.nan, True]
HUGE_INTS = [0, -1, 1, 2, 3, 2**31, 2**63, -2**63, 10**9, 10**18, 10**30]
MAGNITUDES = [1.0] * 6 + [1e-300, 1e300, 1e-30, 1e30, 1e154, 1e-160, 1e200, 1e-8, 1e8]
DTYPES = ["float64"] * 5 + ["float32"] * 2 + ["float16", "int64", "bool"]
LAYOUTS = ["C"] * 5 + ["F", "strided", "reversed", "broadcast"]
SPECIALS = ["none"] * 6 + ["nan", "inf", "-inf", "zeros", "one-huge", "near-max"]
VALID_DTYPES = ["float64"] * 4 + ["float32"] * 2 + ["int64"]
# "near-max": every value scaled so that the largest is 0.9 of the dtype's largest finite
# number (float32 arrays near 3e38, float64 ones near 1.6e308): finite input whose products
# and sums overflow unless the function scales.
VALID_SPECIALS = ["none"] * 6 + ["zeros", "one-huge", "near-max"]


def _strategies():
    """Built on first use, so that the worker never imports hypothesis."""
    from hypothesis import strategies as st

    class G:
        def __init__(self, draw):
            self.draw = draw
            self.sizes = {}
            self.batch = draw(st.sampled_from([(), (), (), (1,), (2,), (2, 3)]))
            # Half the cases are well formed (right shapes, finite values, any magnitude and
            # layout), so that calls reach the numerics instead of stopping at a check.
            self.valid = draw(st.booleans())

        def hostile_now(self):
            return not self.valid and self.draw(st.integers(0, 9)) == 0

        def hostile(self):
            kind = self.draw(st.sampled_from(["none", "str", "list", "float", "int", "array", "complex",
                                              "opaque", "dict", "0d"]))
            if kind == "none":
                return None
            if kind == "str":
                return self.draw(st.sampled_from(["", "x", "nan", "1e400"]))
            if kind == "list":
                return self.draw(st.sampled_from([[], [1, 2], [[1.0], [2.0, 3.0]], [None]]))
            if kind == "float":
                return self.draw(st.sampled_from(EXTREME_FLOATS))
            if kind == "int":
                return self.draw(st.sampled_from(HUGE_INTS))
            if kind == "complex":
                return 1j
            if kind == "opaque":
                return Opaque()
            if kind == "dict":
                return {}
            if kind == "0d":
                return self.array(())
            shape = tuple(self.draw(st.lists(st.integers(0, 5), max_size=4)))
            return self.array(shape)

        def size(self, symbol):
            if symbol not in self.sizes:
                self.sizes[symbol] = self.draw(st.sampled_from([1, 2, 3, 3, 4, 5, 8, 0]))
            return self.sizes[symbol]

        def shape(self, dims):
            shape = []
            for d in dims:
                if d == "B":
                    shape.extend(self.batch)
                elif isinstance(d, int):
                    shape.append(d)
                else:
                    shape.append(self.size(d))
            return tuple(shape)

        def array(self, shape, dtype=None, positive=False, layout=None, special=None):
            seed = self.draw(st.integers(0, 2**32 - 1))
            dtype = dtype or self.draw(st.sampled_from(DTYPES if not self.valid else VALID_DTYPES))
            mag = self.draw(st.sampled_from(MAGNITUDES))
            special = special or self.draw(st.sampled_from(SPECIALS if not self.valid else VALID_SPECIALS))
            layout = layout or self.draw(st.sampled_from(LAYOUTS))
            rng = np.random.default_rng(seed)
            x = np.array(rng.standard_normal(shape) * mag, dtype=np.float64)  # an array even when 0-d
            if positive:
                x = np.abs(x)
            note = f"x{mag:g}" if mag != 1.0 else ""
            if x.size and special != "none":
                note += f" {special}"
                if special == "zeros":
                    x[...] = 0.0
                elif special == "near-max":
                    top = np.abs(x).max()
                    if dtype in ("float16", "float32", "float64") and top > 0:
                        x = x / top * (0.9 * float(np.finfo(dtype).max))
                elif special == "one-huge":
                    x.flat[rng.integers(x.size)] = 1e300
                else:
                    x.flat[rng.integers(x.size)] = float(special)
            if dtype == "bool":
                data = x > 0
            elif dtype == "int64":
                data = np.nan_to_num(np.round(x), posinf=2**62, neginf=-2**62).clip(-2**62, 2**62).astype(np.int64)
            else:
                with np.errstate(all="ignore"):
                    data = x.astype(dtype)
            return Arr(data, layout, note.strip())

        def arr(self, *dims, **kw):
            """An array of the named shape, or (sometimes) a hostile value."""
            if self.hostile_now():
                return self.hostile()
            shape = self.shape(dims)
            if not self.valid and self.draw(st.integers(0, 9)) == 0:  # one axis off by one: a shape mismatch
                shape = tuple(s + (i == 0) for i, s in enumerate(shape))
            return self.array(shape, **kw)

        def clean_arr(self, *dims, **kw):
            """Well shaped and finite, float64: the input a hostile scalar is paired with."""
            return self.array(self.shape(dims), dtype="float64", special="none", **kw)

        def real(self, lo=None):
            """A real parameter: typical values, extremes, or hostile values."""
            if self.hostile_now():
                return self.hostile()
            typical = [1.0, 0.5, 2.0, 0.1, 3.0] if lo is None else [lo + 0.5, lo + 1.0, lo + 0.01]
            extremes = [x for x in EXTREME_FLOATS if math.isfinite(x)] if self.valid else EXTREME_FLOATS
            return self.draw(st.sampled_from(typical * 2 + extremes))

        def integer(self, typical=(1, 2, 3, 4)):
            if self.hostile_now():
                return self.hostile()
            if self.valid:
                return self.draw(st.sampled_from(list(typical)))
            return self.draw(st.sampled_from(list(typical) * 2 + HUGE_INTS + [2.5, -3]))

        def choice(self, options):
            if self.hostile_now():
                return self.hostile()
            return self.draw(st.sampled_from(list(options) + ([] if self.valid else ["nonsense"])))

        def flag(self):
            return self.choice([False, True])

        def causal(self):
            return self.choice([False, True, "top_left", "bottom_right"])

        def mask(self, *dims):
            kind = self.draw(st.sampled_from(["bool", "additive"]))
            if self.draw(st.integers(0, 4)) == 0:  # one element broadcast to every (query, key)
                return self.array((1, 1), dtype="bool" if kind == "bool" else "float64",
                                  special=self.draw(st.sampled_from(["zeros", "none", "-inf"])))
            if kind == "bool":
                return self.arr(*dims, dtype="bool")
            return self.arr(*dims, dtype=self.draw(st.sampled_from(["float64", "float32"])))

        def kwargs(self, **thunks):
            """Each keyword given or left at its default, independently."""
            out = {}
            for key, thunk in thunks.items():
                if self.draw(st.booleans()):
                    out[key] = thunk()
            return out

        def kernel_params(self):
            kernel = self.choice(["exp", "gaussian", "cauchy", "stable"])
            params = {}
            if kernel == "gaussian" or self.draw(st.integers(0, 7)) == 0:
                params["sigma"] = self.real()
            if kernel == "cauchy" or self.draw(st.integers(0, 7)) == 0:
                params["gamma"] = self.real()
            if kernel == "stable":
                params["alpha"] = self.draw(st.sampled_from([0.5, 1.0, 1.5, 2.0, 1e-4, 0.02, 1 + 1e-10, 1 - 1e-10,
                                                             2.5, 0.0, -1.0, math.nan]))
                params.update(self.kwargs(c=lambda: self.real()))
            return kernel, params

        def chain(self, n_layers=None):
            """Widths and (As, Vs) of a deep lightning network."""
            n_layers = n_layers or self.draw(st.integers(1, 3))
            d = [self.draw(st.sampled_from([1, 2, 3, 4])) for _ in range(n_layers + 1)]
            As = [self.arr(d[i], d[i]) if not self.hostile_now() else self.hostile() for i in range(n_layers)]
            Vs = [self.arr(d[i + 1], d[i]) for i in range(n_layers)]
            return d, As, Vs

        def safetensors(self):
            import json

            header = {}
            for i in range(self.draw(st.integers(0, 3))):
                dtype = self.draw(st.sampled_from(["F64", "F32", "F16", "BF16", "I64", "XX", 3]))
                shape = self.draw(st.lists(st.sampled_from([0, 1, 2, 3, 2**32, 2**63, -1, 1.5]), max_size=3))
                size = int(np.prod([s for s in shape if isinstance(s, int) and 0 <= s < 2**20] or [1])) * 8
                start = self.draw(st.sampled_from([0, 0, 8, -8, 2**64]))
                header[f"t{i}"] = {"dtype": dtype, "shape": shape, "data_offsets": [start, start + size]}
            if self.draw(st.booleans()):
                header["__metadata__"] = self.draw(st.sampled_from([{}, {"format": "pt"}, [], None, "x"]))
            raw = json.dumps(header, allow_nan=True).encode()
            mode = self.draw(st.sampled_from(["ok", "ok", "short", "huge-len", "garbage", "nested", "empty"]))
            if mode == "nested":
                raw = b"[" * 20000 + b"]" * 20000
            body = b"\0" * self.draw(st.sampled_from([0, 8, 64, 4096]))
            length = len(raw)
            if mode == "huge-len":
                length = 2**63
            content = struct.pack("<Q", length) + raw + body
            if mode == "short":
                content = content[: self.draw(st.integers(0, len(content)))]
            if mode == "garbage":
                content = bytes(np.random.default_rng(self.draw(st.integers(0, 999))).integers(0, 256, 64, dtype=np.uint8))
            if mode == "empty":
                content = b""
            return File(content, note=mode)

    return st, G


def _attention(g, extra=None, value=True, backward=False):
    args = [g.arr("B", "n", "d"), g.arr("B", "m", "d")]
    if value:
        args.append(g.arr("B", "m", "e"))
    if backward:
        args.append(g.arr("B", "n", "e"))
    return args


def _kernel_call(g, backward=False):
    kernel, params = g.kernel_params()
    kw = g.kwargs(causal=g.causal, mask=lambda: g.mask("n", "m"), scale=g.real)
    if not backward:
        kw.update(g.kwargs(return_routing=g.flag, return_log_partition=g.flag))
    return _attention(g, backward=backward), {"kernel": kernel, **kw, **params}


def _whiten_factors(g):
    L = g.arr("D", "D")
    if (isinstance(L, Arr) and L.data.ndim == 2 and L.data.shape[0] == L.data.shape[1]
            and L.data.dtype.kind == "f" and g.draw_bool()):
        L.data = L.data + 3 * np.eye(L.data.shape[0], dtype=L.data.dtype)  # usually invertible
    return L, g.arr("D", "D")


SPECS = {
    "get_num_threads": lambda g: ((), {}),
    "set_num_threads": lambda g: ((g.integer((1, 2, 4, 16, 17, 64, 100000)),), {}),
    "show_config": lambda g: ((), g.kwargs(file=lambda: g.choice([None, Opaque(), 3]))),
    "softmax_attention": lambda g: (
        _attention(g),
        g.kwargs(mask=lambda: g.mask("n", "m"), causal=g.causal, scale=g.real,
                 return_routing=g.flag, return_log_partition=g.flag)),
    "kernel_attention": lambda g: _kernel_call(g),
    "softmax_attention_backward": lambda g: (
        _attention(g, backward=True),
        g.kwargs(mask=lambda: g.mask("n", "m"), causal=g.causal, scale=g.real,
                 y=lambda: g.arr("B", "n", "e"), log_partition=lambda: g.arr("B", "n"))),
    "kernel_attention_backward": lambda g: _kernel_call(g, backward=True),
    "projection_attention": lambda g: (
        _attention(g), g.kwargs(sigma=g.real, causal=g.causal, mask=lambda: g.mask("n", "m"), return_routing=g.flag)),
    "projection_attention_backward": lambda g: (
        _attention(g, backward=True), g.kwargs(sigma=g.real, causal=g.causal, mask=lambda: g.mask("n", "m"))),
    "lightning_attention": lambda g: (_attention(g), g.kwargs(causal=g.causal)),
    "lightning_attention_backward": lambda g: (_attention(g, backward=True), g.kwargs(causal=g.causal)),
    "random_feature_attention": lambda g: (
        _attention(g),
        g.kwargs(num_features=lambda: g.integer((1, 4, 16)), orthogonal=g.flag, seed=lambda: g.integer((0, 1)),
                 causal=g.causal, scale=g.real, return_log_partition=g.flag)),
    "random_feature_attention_backward": lambda g: (
        _attention(g, backward=True),
        g.kwargs(num_features=lambda: g.integer((1, 4, 16)), orthogonal=g.flag, seed=lambda: g.integer((0, 1)),
                 causal=g.causal, scale=g.real)),
    "random_features": lambda g: (
        (g.arr("B", "n", "d"), g.integer((1, 4, 16))),
        g.kwargs(orthogonal=g.flag, seed=lambda: g.integer((0, 1)), per_row=g.flag)),
    "feature_matrix": lambda g: (
        (g.integer((1, 2, 4)), g.integer((1, 4, 16))), g.kwargs(orthogonal=g.flag, seed=lambda: g.integer((0, 1)))),
    "sampled_attention": lambda g: (
        [g.arr("n", "d"), g.arr("m", "d"), g.arr("m", "e")],
        {"num_samples": g.integer((1, 4, 16)),
         **g.kwargs(proposal=lambda: g.choice(["uniform", "tilted"]), seed=lambda: g.integer((0, 1)),
                    scale=g.real, sketch_rank=lambda: g.integer((1, 2)))}),
    "local_flatness": lambda g: ((g.arr("n", "d"), g.arr("n", "e")), g.kwargs(n_neighbors=lambda: g.integer((2, 3)))),
    "lightning_layer": lambda g: (
        (g.arr("B", "t", "d"), g.arr("d", "d"), g.arr("e", "d")),
        g.kwargs(kind=lambda: g.choice(["lightning", "softmax"]), temperature=g.real, causal=g.flag)),
    "deep_lightning": lambda g: (
        (lambda d, As, Vs: ((g.arr("B", "t", d[0]), As, Vs),
                            g.kwargs(kind=lambda: g.choice(["lightning", "softmax"]), temperature=g.real,
                                     causal=g.flag)))(*g.chain())),
    "psi": lambda g: (
        (lambda kernel, params: ((g.arr("B", "n"), g.arr("B", "n"), kernel), params))(*g.kernel_params())),
    "stable_density": lambda g: (
        (g.arr("B", "n"), g.draw_from([0.5, 1.0, 1.5, 2.0, 1e-4, 0.02, 0.3, 1 + 1e-10, 1 - 1e-10, 1.999] + EXTREME_FLOATS)),
        g.kwargs(c=g.real, log=g.flag)),
    "tilt_radius": lambda g: ((g.arr("B", "n", "d"),), g.kwargs(scale=g.real)),
    "radon_project": lambda g: ((g.arr("B", "n", "d"), g.arr("B", "m", "d")), {}),
    "laplace_radon_transform": lambda g: (
        (lambda kernel, params: ((g.arr("B", "n", "d"), g.tau("B", "n"), g.arr("B", "m", "d")),
                                 {**g.kwargs(v=lambda: g.arr("B", "m", "e"), log_domain=g.flag), "kernel": kernel,
                                  **params}))(*g.kernel_params())),
    "laplace_radon_attention": lambda g: (
        (lambda kernel, params: ((g.arr("B", "n", "d"), g.tau("B", "n"), g.arr("B", "m", "d"), g.arr("B", "m", "e")),
                                 {**g.kwargs(mask=lambda: g.mask("n", "m"), causal=g.causal, return_routing=g.flag,
                                             return_log_partition=g.flag), "kernel": kernel,
                                  **params}))(*g.kernel_params())),
    "projected_cumulants": lambda g: (
        (lambda kernel, params: ((g.arr("B", "n", "d"), g.tau("B", "n"), g.arr("B", "m", "d")),
                                 {**g.kwargs(order=lambda: g.integer((1, 2, 3, 4))), "kernel": kernel,
                                  **params}))(*g.kernel_params())),
    "log_partition_gradient": lambda g: ((g.arr("B", "n", "d"), g.arr("B", "m", "d")), g.kwargs(scale=g.real, hessian=g.flag)),
    "Subspace": lambda g: ((g.arr("n", "k"), g.kwargs(complement=g.flag), g.arr("m", "n")), {}),
    "null_space": lambda g: ((g.arr("B", "m", "n"),), g.kwargs(rtol=g.real)),
    "singular_values": lambda g: ((g.arr("B", "m", "n"),), {}),
    "factored_svd": lambda g: ((g.arr("B", "m", "r"), g.arr("B", "r", "p")), {}),
    "parameter_nulls": lambda g: ((g.arr("B", "D", "d"), g.arr("B", "D", "d")), g.kwargs(rtol=g.real)),
    "effective_rank": lambda g: (
        (g.arr("B", "m", "n") if g.draw_bool() else g.arr("k"),),
        g.kwargs(kind=lambda: g.choice(["entropy", "energy", "participation"]), spectrum=g.flag)),
    "cumulative_energy": lambda g: ((g.arr("B", "m", "n") if g.draw_bool() else g.arr("k"),), g.kwargs(spectrum=g.flag)),
    "tilt_coverage": lambda g: (
        (g.arr("B", "n", "d"),),
        g.kwargs(W_K=lambda: g.arr("D", "d"), rtol=g.real, centered=g.flag,
                 batch_ndim=lambda: g.integer((0, len(g.batch))))),
    "TiltCoverage": lambda g: (
        (g.integer((g.size("d"),)), [g.arr("n", "d") for _ in range(g.draw_int(0, 3))],
         g.kwargs(W_K=lambda: g.arr("D", "d"), rtol=g.real, centered=g.flag)), {}),
    "routing_nulls": lambda g: ((g.arr("B", "n", "m"),), g.kwargs(rtol=g.real)),
    "gauge_transform": lambda g: ((g.arr("B", "D", "d"), g.arr("B", "D", "d"), g.arr("B", "d", "d")), {}),
    "gauge_invariance_error": lambda g: (
        (g.arr("D", "d"), g.arr("D", "d"), g.arr("d", "d"), g.arr("B", "n", "D")),
        g.kwargs(W_V=lambda: g.arr("D", "e"), scale=g.real)),
    "head_diagnostics": lambda g: (
        (g.arr("B", "D", "d"), g.arr("B", "D", "d")),
        g.kwargs(W_V=lambda: g.arr("B", "D", "e"), W_O=lambda: g.arr("B", "e", "D"), x=lambda: g.arr("n", "D"),
                 scale=g.real, causal=g.causal, rtol=g.real)),
    "network_forward": lambda g: g.network_call(),
    "parametrization_jacobian": lambda g: g.network_call(),
    "expected_dimension": lambda g: (
        g.widths(), g.kwargs(kind=lambda: g.choice(["lightning", "softmax"]))),
    "neuromanifold_dimension": lambda g: (
        g.widths(small=True),
        g.kwargs(kind=lambda: g.choice(["lightning", "softmax"]), t=lambda: g.integer((1, 2, 3)),
                 n_samples=lambda: g.integer((1, 4, 8)), n_draws=lambda: g.integer((1, 2)),
                 seed=lambda: g.integer((0, 1)), temperature=g.real)),
    "numerical_rank": lambda g: ((g.arr("m", "n"),), g.kwargs(block_rows=lambda: g.integer((1, 2, 3)))),
    "parameter_count": lambda g: (g.widths(), {}),
    "random_weights": lambda g: (g.widths(), g.kwargs(seed=lambda: g.integer((0, 1)))),
    "virtual_weights": lambda g: (g.chain()[1:], {}),
    "whiten": lambda g: ((g.arr("B", "T", "D"), *_whiten_factors(g)), {}),
    "whiten_backward": lambda g: (
        (g.arr("B", "T", "D"), *_whiten_factors(g), g.arr("B", "T", "D")),
        g.kwargs(w=lambda: g.arr("B", "T", "D"), block=lambda: g.integer((1, 2, 64)))),
    "whiten_scan": lambda g: ((g.arr("B", "T", "D"), *_whiten_factors(g)), g.kwargs(block=lambda: g.integer((1, 2, 64)))),
    "block_covariances": lambda g: ((g.arr("b", "T", "D"),), {}),
    "steady_state_factor": lambda g: (
        (g.spd("D"), g.arr("D", "D")), g.kwargs(tol=g.real, max_iter=lambda: g.integer((1, 10, 100)))),
    "block_cholesky_factors": lambda g: ((g.spd("D"), g.arr("D", "D"), g.integer((1, 2, 5))), {}),
    "block_diagonal_factor": lambda g: ((g.spd("D"),), {}),
    "full_whitening": lambda g: ((g.arr("b", "T", "D"),), {}),
    "whitened_attention": lambda g: (
        (g.arr("B", "T", "D"), g.arr("D", "d"), g.arr("D", "d"), *_whiten_factors(g)),
        g.kwargs(causal=g.flag, scale=g.real, return_routing=g.flag)),
    "whiteness": lambda g: ((g.arr("b", "T", "D"),), {}),
    "stationarity": lambda g: ((g.arr("b", "T", "D"),), {}),
    "vector_ma1": lambda g: ((g.arr("D", "D"), g.integer((1, 2)), g.integer((1, 3, 5))), g.kwargs(seed=lambda: g.integer((0,)))),
    "vector_ar1": lambda g: (
        (g.scaled("D", "D"), g.integer((1, 2)), g.integer((1, 3, 5))),
        g.kwargs(seed=lambda: g.integer((0,)), burn_in=lambda: g.integer((0, 1, 10)))),
    "head_operator": lambda g: ((g.arr("B", "n", "m"), g.arr("B", "D", "e"), g.arr("B", "m", "D")), {}),
    "virtual_head": lambda g: ((g.arr("B", "n", "n"), g.arr("B", "D", "D"), g.arr("B", "n", "n"), g.arr("B", "D", "D")), {}),
    "composition_scores": lambda g: (
        (g.arr("l", "h", "D", "d"), g.arr("l", "h", "D", "d"), g.arr("l", "h", "D", "d"), g.arr("l", "h", "d", "D")),
        g.kwargs(mode=lambda: g.choice(["Q", "K", "V"]))),
    "path_expansion": lambda g: (
        (g.arr("l", "h", "n", "n"), g.arr("l", "h", "D", "D"), g.arr("n", "D")),
        g.kwargs(mlp_jacobians=lambda: g.arr("l", "D", "D"), max_length=lambda: g.integer((0, 1, 2)))),
    "layernorm": lambda g: (
        (g.arr("B", "n", "D"),), g.kwargs(gamma=lambda: g.arr("D"), beta=lambda: g.arr("D"), eps=g.real)),
    "layernorm_jacobian": lambda g: ((g.arr("B", "D"),), g.kwargs(gamma=lambda: g.arr("D"), eps=g.real)),
    "topk_router": lambda g: ((g.arr("B", "n", "m"), g.integer((1, 2))), {}),
    "router_gram": lambda g: ((g.arr("n", "m"),), {}),
    "latent_factorization": lambda g: ((g.arr("m", "n"), g.integer((1, 2))), {}),
    "principal_angles": lambda g: ((g.arr("d", "p"), g.arr("d", "q")), {}),
    "embedding_injectivity": lambda g: ((g.arr("d", "n"), g.arr("d", "p")), g.kwargs(atol=g.real)),
    "mlp_key_value": lambda g: (
        (g.arr("B", "n", "D"), g.arr("D", "f"), g.arr("f", "D")),
        {**g.kwargs(activation=lambda: g.choice(["relu", "gelu", "silu", "identity"])),
         **g.kwargs(b1=lambda: g.arr("f"), b2=lambda: g.arr("D"))}),
    "load_heads": lambda g: (
        (g.safetensors() if not g.hostile_now() else g.hostile(),),
        g.kwargs(n_heads=lambda: g.integer((1, 2)), n_kv_heads=lambda: g.integer((1,)),
                 layout=lambda: g.choice(["bert", "gpt2", "llama"]), backend=lambda: g.choice(["auto", "python"]))),
    "load_model": lambda g: ((g.model() if g.draw_bool() else g.safetensors(),),
                             g.kwargs(backend=lambda: g.choice(["auto", "python"]))),
    # Model objects come from load_model; fuzzed through a forward pass on token ids (working
    # GPT-2, Mixtral and DeepSeek-V2 checkpoints among them).
    "Model": lambda g: ((g.model() if g.draw_bool() else g.safetensors(), g.arr("n")), {}),
    # The research functions take a model (a checkpoint path here, or hostile) and a prompt.
    "logit_lens": lambda g: ((g.model(), g.prompt()), g.kwargs(k=lambda: g.integer((1, 2, 5)),
                                                              dtype=lambda: g.choice([np.float32, np.float64]))),
    "induction_scores": lambda g: (
        (g.model(),),
        g.kwargs(seq_len=lambda: g.integer((2, 3, 50)), n_repeats=lambda: g.integer((2, 3)),
                 n_sequences=lambda: g.integer((1, 2)), bos=lambda: g.integer((0, 1)), threshold=g.real,
                 seed=lambda: g.integer((0, 1)))),
    "weight_spectra": lambda g: ((g.model(),), g.kwargs(prompt=g.prompt)),
    "latent_key_cache": lambda g: (
        (g.model(), g.prompt()),
        g.kwargs(rank=lambda: g.integer((1, 2, 3)), rotary=g.flag, rtol=g.real)),
    "router_statistics": lambda g: ((g.model(), g.prompt()), {}),
    "corpus_statistics": lambda g: (
        (g.model(), [g.prompt() for _ in range(g.draw_int(0, 3))] if not g.hostile_now() else g.hostile()),
        g.kwargs(statistics=lambda: g.choice([("radius", "tilt"), ("routing", "cumulants"), ("whiteness",), (), ("x",)]),
                 batch_tokens=lambda: g.integer((1, 4, 64)), partitions=lambda: g.integer((1, 2, 3)),
                 max_length=lambda: g.integer((1, 3)), dtype=lambda: g.choice([np.float32, np.float64]),
                 blas_threads=lambda: g.integer((1, 2)))),
    "write_activations": lambda g: (
        (g.model(), [g.prompt() for _ in range(g.draw_int(0, 3))] if not g.hostile_now() else g.hostile(),
         NewPath() if not g.hostile_now() else g.hostile()),
        g.kwargs(batch_tokens=lambda: g.integer((1, 4, 64)), max_length=lambda: g.integer((1, 3)),
                 chunk_tokens=lambda: g.integer((1, 2, 256)), dtype=lambda: g.choice([np.float32, np.float64]),
                 overwrite=g.flag, blas_threads=lambda: g.integer((1, 2)))),
    "models.read_safetensors": lambda g: (
        (g.safetensors(),), g.kwargs(backend=lambda: g.choice(["auto", "python", "package"]))),
    "models.split_texts": lambda g: (
        (g.choice(["", "a\n\nb", "one\r\ntwo\n \n", "\x00\n\t\n", "x" * 3]) if not g.hostile_now()
         else g.hostile(),),
        g.kwargs(by=lambda: g.choice(["paragraph", "line", "word", None]))),
    "fit_exponential_sum": lambda g: (
        (g.grid("N"), g.arr("B", "N")),
        g.kwargs(order=lambda: g.integer((1, 2)), rtol=g.real, pencil=lambda: g.integer((1, 2, 3)), vector=g.flag)),
    "invert_laplace_density": lambda g: (
        (g.grid("K"), g.arr("K", positive=True), g.grid("G")),
        g.kwargs(regularization=g.real, nonneg=g.flag)),
    "wasserstein1": lambda g: ((g.grid("G"), g.arr("G", positive=True), g.arr("G", positive=True)), {}),
    "reconstruct_points": lambda g: (
        (g.arr("m", "d"), g.arr("m", "n")),
        g.kwargs(weights=lambda: g.arr("m", "n"), values=lambda: g.arr("m", "n", "e"), tol=g.real)),
    "recover_keys": lambda g: (
        (g.probe(), g.arr("m", "d"), g.grid("T", imaginary=g.draw_bool())),
        g.kwargs(order=lambda: g.integer((1, 2)), rtol=g.real)),
    "head_probe": lambda g: ((g.arr("m", "d"), g.arr("m", "e")), {}),
    "radon": lambda g: ((g.arr("s", "s"),), g.kwargs(theta=lambda: g.arr("a"), circle=g.flag)),
    "radon_adjoint": lambda g: ((g.arr("s", "a"),), g.kwargs(theta=lambda: g.arr("a"))),
    "iradon": lambda g: (
        (g.arr("s", "a"),),
        g.kwargs(theta=lambda: g.arr("a"), output_size=lambda: g.integer((1, 4, 8)),
                 filter=lambda: g.choice(["ramp", "shepp-logan", "cosine", "hamming", "hann", None]),
                 circle=g.flag)),
    "iradon_sart": lambda g: (
        (g.arr("s", "a"),),
        g.kwargs(theta=lambda: g.arr("a"), iterations=lambda: g.integer((1, 2)), image=lambda: g.arr("s", "s"),
                 relaxation=g.real, clip=lambda: g.choice([(0.0, 1.0), (1.0, 0.0), (math.nan, 1.0)]))),
    "fourier_filter": lambda g: (
        (g.integer((1, 2, 8, 64)),),
        g.kwargs(filter=lambda: g.choice(["ramp", "shepp-logan", "cosine", "hamming", "hann", None]))),
    "shepp_logan_phantom": lambda g: (
        (), g.kwargs(size=lambda: g.integer((1, 8, 16)), render=lambda: g.integer((1, 16, 32)))),
    "circle_mask": lambda g: ((g.integer((0, 1, 8, 9)),), {}),
    "limited_angle": lambda g: ((g.arr("a"), g.real()), g.kwargs(center=g.real)),
    "rms_error": lambda g: ((g.arr("B", "n", "d"), g.arr("B", "n", "d")), {}),
    "virtual_network": lambda g: (
        ([g.arr("d", "d") for _ in range(g.draw_int(0, 3))], g.arr("e", "d"), g.arr("d", "t")), {}),
    "gl_transform": lambda g: (
        (lambda d, As, Vs: ((As, Vs, [g.arr(d[i + 1], d[i + 1]) for i in range(len(As) - 1)]), {}))(*g.chain())),
    "rescale": lambda g: (
        (lambda d, As, Vs: ((As, Vs, [g.real() for _ in As]), {}))(*g.chain())),
    "function_discrepancy": lambda g: (
        (lambda d, As, Vs: (((As, Vs), (As[::-1], Vs), g.arr("N", "t", d[0])),
                            g.kwargs(kind=lambda: g.choice(["lightning", "softmax"]), temperature=g.real)))(*g.chain())),
    "is_critical": lambda g: (
        (g.arr("d", "d"), g.arr("e", "d")),
        g.kwargs(kind=lambda: g.choice(["lightning", "softmax"]), t=lambda: g.integer((1, 2, 3)),
                 n_samples=lambda: g.integer((1, 4, 8)), seed=lambda: g.integer((0,)))),
}


def _extend_generator(G, st):
    """Helpers used by several specs (kept out of the class body above for brevity)."""

    def draw_bool(self):
        return self.draw(st.booleans())

    def draw_int(self, lo, hi):
        return self.draw(st.integers(lo, hi))

    def draw_from(self, options):
        return self.draw(st.sampled_from(options))

    def tau(self, *dims):
        """Radii: real, sometimes complex (accepted by the exponential kernel)."""
        t = self.arr(*dims)
        if isinstance(t, Arr) and t.data.dtype.kind == "f" and self.draw(st.integers(0, 4)) == 0:
            with np.errstate(all="ignore"):  # inf * 1j has a NaN real part: that is input too
                t.data = t.data.astype(np.complex128) * 1j
        return t

    def grid(self, symbol, imaginary=False):
        """A uniform grid (sometimes hostile): the sample points of the inverse problems."""
        if self.hostile_now():
            return self.hostile()
        if symbol not in self.sizes:  # sample grids also grow long (more samples than a pencil needs)
            self.sizes[symbol] = self.draw(st.sampled_from([1, 2, 3, 3, 4, 5, 8, 0, 12, 17, 32]))
        n = self.size(symbol)
        step = self.draw(st.sampled_from([0.1, 1.0, 1e-300, 1e300, 0.0, -0.5]))
        x = np.arange(n) * step - n * step / 2
        note = f"step {step:g}"
        if n and not self.valid and self.draw(st.integers(0, 4)) == 0:  # a NaN sample point
            x[self.draw(st.integers(0, n - 1))] = math.nan
            note += " nan"
        return Arr(x * 1j if imaginary else x, "C", note)

    def spd(self, symbol):
        """Usually symmetric positive definite (covariance blocks), sometimes not."""
        a = self.arr(symbol, symbol)
        if isinstance(a, Arr) and a.data.ndim == 2 and a.data.dtype.kind == "f" and self.draw_bool():
            m = a.data.astype(np.float64)
            with np.errstate(all="ignore"):
                a.data = (m @ m.T + np.eye(m.shape[0])).astype(a.data.dtype)
            a.note += " spd"
        return a

    def scaled(self, *dims):
        """A matrix scaled to spectral radius below 1 (stable AR(1)), sometimes not."""
        a = self.arr(*dims)
        if isinstance(a, Arr) and a.data.ndim == 2 and a.data.dtype.kind == "f" and self.draw_bool():
            m = a.data.astype(np.float64)
            if m.size and np.all(np.isfinite(m)):
                r = np.max(np.abs(np.linalg.eigvals(m))) if m.shape[0] == m.shape[1] else 0
                a.data = (m / (2 * r) if r > 0 else m).astype(a.data.dtype)
                a.note += " stable"
        return a

    def widths(self, small=False):
        if self.hostile_now():
            return (self.hostile(), self.hostile())
        n_layers = self.draw(st.integers(0 if not small else 1, 3))
        pool = [1, 2, 3] if small else [0, 1, 2, 3, 10**9, -1, 2.5]
        d = [self.draw(st.sampled_from(pool)) for _ in range(n_layers + 1)]
        a = [self.draw(st.sampled_from(pool)) for _ in range(n_layers + self.draw(st.sampled_from([0, 0, 0, 1])))]
        return (d, a)

    def network_call(self):
        d, As, Vs = self.chain()
        weights = []
        for i in range(len(As)):
            a = self.draw(st.sampled_from([1, 2, 3]))
            weights.append((self.arr(a, d[i]), self.arr(a, d[i]), Vs[i]))
        if self.hostile_now():
            weights = self.hostile()
        X = self.arr("N", "t", d[0]) if self.draw_bool() else self.arr("t", d[0])
        return (weights, X), self.kwargs(kind=lambda: self.choice(["lightning", "softmax"]), temperature=self.real)

    def probe(self):
        broken = self.draw(st.sampled_from([None, None, None, "wrong_shape", "nan", "raises"]))
        if broken:
            return Probe(broken=broken)
        # The head behind the probe is well formed: head_probe's own checks are fuzzed apart.
        d = max(1, self.size("d"))
        return Probe(self.clean_arr(3, d), self.clean_arr(3, 2))

    def model(self):
        """A small working checkpoint (GPT-2 with a planted circuit, a Mixtral or DeepSeek-V2
        with experts and latent attention), a checkpoint file (usually broken) or a hostile value."""
        if self.hostile_now():
            return self.hostile()
        kind = self.draw(st.integers(0, 5))
        if kind == 0:
            return self.safetensors()
        return PlantedModel() if kind <= 2 else TinyModel("mixtral" if kind == 3 else "deepseek_v2")

    def prompt(self):
        """Token ids, a text, or a hostile value."""
        if self.draw(st.integers(0, 4)) == 0:
            return self.draw(st.sampled_from(["", "the cat", "x" * 3]))
        ids = self.arr("n", dtype=self.draw(st.sampled_from(["int64", "int64", "float64"])))
        return ids

    for f in (draw_bool, draw_int, draw_from, tau, grid, spd, scaled, widths, network_call, probe, model, prompt):
        setattr(G, f.__name__, f)


_CACHE = {}


def case_strategy(name):
    """The hypothesis strategy of (args, kwargs) for one public function."""
    if "G" not in _CACHE:
        st, G = _strategies()
        _extend_generator(G, st)
        _CACHE["st"], _CACHE["G"] = st, G
    st, G = _CACHE["st"], _CACHE["G"]
    spec = SPECS[name]

    @st.composite
    def case(draw):
        args, kwargs = spec(G(draw))
        return tuple(args), dict(kwargs)

    return case()


# --------------------------------------------------------------------------------------
# Which functions are public


def public_targets():
    """Every callable of attngeom.__all__ that computes something, plus the readers.

    Result containers (dataclasses, and the NamedTuple-like result types with no methods of
    their own) are built by the functions, not called by users on raw input.
    """
    import attngeom as ag

    names = []
    for name in ag.__all__:
        obj = getattr(ag, name)
        if inspect.ismodule(obj) or not callable(obj):
            continue
        if inspect.isclass(obj):
            own = [k for k, v in vars(obj).items() if callable(v) and not k.startswith("_")]
            if dataclasses.is_dataclass(obj) or issubclass(obj, tuple) or not own:
                continue
        names.append(name)
    # attngeom.models is public through load_heads; its reader and the text splitter of the
    # commands are fuzzed directly as well.
    names += ["models.read_safetensors", "models.split_texts"]
    return sorted(names)


def run_campaign(name, worker, examples, record):
    """Draw ``examples`` cases of one function, run each in the worker, pass outcomes on."""
    from hypothesis import HealthCheck, Phase, given, settings

    phases = [Phase.explicit, Phase.reuse, Phase.generate] + ([Phase.shrink] if SHRINK else [])

    @settings(max_examples=examples, derandomize=not RANDOM, deadline=None, database=None, phases=phases,
              suppress_health_check=list(HealthCheck), print_blob=False)
    @given(case_strategy(name))
    def fuzz(case):
        args, kwargs = case
        outcome, detail = worker.run(name, args, kwargs)
        record(name, args, kwargs, outcome, detail)

    fuzz()


# --------------------------------------------------------------------------------------
# pytest



@pytest.fixture(scope="module")
def worker():
    w = Worker()
    yield w
    w.close()


def test_every_public_function_has_a_strategy():
    missing = [n for n in public_targets() if n not in SPECS]
    assert not missing, f"public functions without a fuzz strategy in tests/test_fuzz.py SPECS: {missing}"
    stale = [n for n in SPECS if n not in public_targets()]
    assert not stale, f"SPECS entries that are no longer public: {stale}"


def test_worker_reports_crash_and_recovers(worker):
    """The harness itself: a segfault is a crash with the worker's report, and the next call runs."""
    outcome, detail = worker.run("_segfault", (), {})
    assert outcome == "crash", (outcome, detail)
    assert "_segfault" in detail  # faulthandler's (or ASan's) stack names the function
    assert worker.run("get_num_threads", (), {})[0] == "return"


def test_outcome_classes():
    """The classifier: a silent NaN, an unnamed error and a clean error are told apart."""
    w = Worker()
    try:
        assert w.run("rms_error", (Arr(np.ones(2)), Arr(np.ones(2))), {})[0] == "return"
        nan_out = w.run("_nan_from_finite", (Arr(np.ones(2)),), {})
        assert nan_out[0] == "non-finite:nan", nan_out
        assert w.run("_unnamed_error", (1.0,), {})[0] == "unnamed-error"
        assert w.run("rms_error", (Arr(np.ones(2)), Arr(np.ones(3))), {})[0] == "error"
    finally:
        w.close()


@pytest.mark.parametrize("name", public_targets())
def test_fuzz(name, worker):
    if name not in SPECS:
        pytest.fail(f"{name} has no fuzz strategy")

    def record(name, args, kwargs, outcome, detail):
        assert outcome in CLEAN, f"{name}({describe(args, kwargs)}) -> {outcome}: {detail}"

    run_campaign(name, worker, EXAMPLES, record)


# Stand-ins for the harness tests.


def _segfault():
    import ctypes

    ctypes.string_at(0)


def _nan_from_finite(x):
    return x * np.nan


def _unnamed_error(x):
    raise ValueError("something is wrong")


# --------------------------------------------------------------------------------------
# Campaign mode


def main(argv):
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--examples", type=int, default=EXAMPLES, help="cases per function")
    parser.add_argument("--report", action="store_true", help="print counts and every bad outcome")
    parser.add_argument("--only", nargs="*", help="fuzz only these functions")
    parser.add_argument("--per-function", type=int, default=3, help="bad outcomes listed per function")
    opts = parser.parse_args(argv)
    names = opts.only or public_targets()
    missing = [n for n in names if n not in SPECS]
    counts, bad = Counter(), defaultdict(list)
    calls = Counter()
    worker = Worker()
    t0 = time.time()
    for name in names:
        if name in missing:
            continue

        def record(name, args, kwargs, outcome, detail):
            counts[outcome] += 1
            calls[name] += 1
            if outcome not in CLEAN:
                bad[name].append((outcome, describe(args, kwargs), detail))

        t1 = time.time()
        run_campaign(name, worker, opts.examples, record)
        if opts.report:
            print(f"{name}: {calls[name]} cases, {len(bad[name])} bad, {time.time() - t1:.1f} s", file=sys.stderr)
    worker.close()
    total = sum(counts.values())
    print(f"\nfuzz campaign: {len(names) - len(missing)} functions, {total} cases, {time.time() - t0:.0f} s, "
          f"{worker.started} worker processes")
    print(f"  clean returns: {counts['return']}")
    print(f"  clean errors (ValueError/TypeError naming an argument): {counts['error']}")
    n_bad = total - counts["return"] - counts["error"]
    print(f"  bad outcomes: {n_bad}")
    for outcome, n in sorted(counts.items()):
        if outcome not in CLEAN:
            print(f"    {outcome}: {n}")
    if missing:
        print(f"  functions without a strategy: {missing}")
    if opts.report and n_bad:
        print("\nbad outcomes by function (first ones of each):")
        for name in sorted(n for n in bad if bad[n]):
            kinds = Counter(o for o, _, _ in bad[name])
            print(f"\n{name}: {dict(kinds)}")
            seen = set()
            for outcome, case, detail in bad[name]:
                key = (outcome, detail.splitlines()[0][:80] if detail else "")
                if key in seen:
                    continue
                seen.add(key)
                if len(seen) > opts.per_function:
                    break
                first = detail.splitlines()[0] if detail else ""
                print(f"  {outcome}: {name}({case})\n      {first[:300]}")
                if outcome in ("crash", "timeout"):
                    print("      " + "\n      ".join(detail.splitlines()[1:30]))
    return 1 if n_bad or missing else 0


if __name__ == "__main__":
    if sys.argv[1:] == ["--worker"]:
        worker_main()
    else:
        sys.exit(main(sys.argv[1:]))
