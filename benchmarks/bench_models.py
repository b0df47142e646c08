"""Model reports: every head of a 12-layer, 12-head, d_model 768 checkpoint, weights only.

A synthetic GPT-2-layout checkpoint of that size (float32 or bfloat16 on disk, with biases
and config.json) is written to a temporary folder, then timed:

1. load_heads with the built-in safetensors reader and with the safetensors package (if
   installed);
2. the weights-only diagnostics of all 144 heads (factored SVDs of B = W_Q W_K^T and W_OV,
   parameter nulls) against a plain NumPy loop forming B and W_OV and taking dense SVDs,
   timed on the first --numpy-heads heads and compared per head;
3. the whole `attngeom heads` command (reading, analysis, heads.json and the PNGs), which
   the issue wants under 10 s.

  python benchmarks/bench_models.py [--out DIR] [--dtype F32|BF16] [--numpy-heads H] [--quick]

Ratios (ours / anchor, lower = attngeom faster) are what to read.
"""
from __future__ import annotations

import json
import os
import sys
import tempfile
import time

import numpy as np

import attngeom as ag
from attngeom import cli
from attngeom.models import write_safetensors
from harness import machine, parse, parser, write


def timed(f):
    t0 = time.perf_counter()
    out = f()
    return out, time.perf_counter() - t0


def synthetic_gpt2(folder, n_layers, n_heads, d_model, dtype, rng):
    s = 1 / np.sqrt(d_model)
    t = {}
    for i in range(n_layers):
        t[f"h.{i}.attn.c_attn.weight"] = (rng.standard_normal((d_model, 3 * d_model)) * s).astype(np.float32)
        t[f"h.{i}.attn.c_attn.bias"] = (rng.standard_normal(3 * d_model) * 0.02).astype(np.float32)
        t[f"h.{i}.attn.c_proj.weight"] = (rng.standard_normal((d_model, d_model)) * s).astype(np.float32)
        t[f"h.{i}.attn.c_proj.bias"] = np.zeros(d_model, np.float32)
    os.makedirs(folder, exist_ok=True)
    write_safetensors(os.path.join(folder, "model.safetensors"), t, dtype=dtype)
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump({"n_layer": n_layers, "n_head": n_heads, "n_embd": d_model}, f)
    return os.path.getsize(os.path.join(folder, "model.safetensors"))


def numpy_head(wq, wk, wv, wo):
    """One head the plain way: formed B and W_OV, dense SVDs, ranks by the matrix_rank rule."""
    d = wq.shape[0]
    sb = np.linalg.svd(wq @ wk.T, compute_uv=False)
    so = np.linalg.svd(wv @ wo, compute_uv=False)
    eps = np.finfo(float).eps
    return int(np.sum(sb > d * eps * sb[0])), int(np.sum(so > d * eps * so[0]))


def main(argv=None):
    p = parser(__doc__, repeats=None, threads=True)
    p.add_argument("--dtype", default="F32", choices=["F32", "F16", "BF16"], help="storage dtype of the checkpoint")
    p.add_argument("--numpy-heads", type=int, default=12, help="heads the NumPy loop is timed on")
    p.add_argument("--quick", action="store_true", help="a 4-layer, 4-head, d_model 256 model")
    args = parse(p, argv)
    n_layers, n_heads, d_model = (4, 4, 256) if args.quick else (12, 12, 768)
    rng = np.random.default_rng(0)
    meta = machine(dtype=args.dtype)
    res = {"n_layers": n_layers, "n_heads": n_heads, "d_model": d_model, "d_head": d_model // n_heads}
    with tempfile.TemporaryDirectory() as tmp:
        folder = os.path.join(tmp, "model")
        size, t_write = timed(lambda: synthetic_gpt2(folder, n_layers, n_heads, d_model, args.dtype, rng))
        res.update(file_mb=size / 2 ** 20, t_write=t_write)
        print(f"{n_layers} x {n_heads} heads, d_model {d_model}, {args.dtype} checkpoint of {size / 2 ** 20:.0f} MB",
              flush=True)
        heads, res["t_load_python"] = timed(lambda: ag.load_heads(folder, backend="python"))
        try:
            _, res["t_load_package"] = timed(lambda: ag.load_heads(folder, backend="package"))
        except ImportError:
            res["t_load_package"] = None
        pkg = "n/a" if res["t_load_package"] is None else f"{res['t_load_package']:.2f} s"
        print(f"  load_heads: built-in reader {res['t_load_python']:.2f} s, safetensors package {pkg}", flush=True)

        d, res["t_diagnostics"] = timed(lambda: heads.diagnostics())
        pairs = [(l, h) for l in range(n_layers) for h in range(n_heads)][: args.numpy_heads]
        ranks, t_np = timed(lambda: [numpy_head(heads.W_Q[l, h], heads.W_K[l, h], heads.W_V[l, h], heads.W_O[l, h])
                                     for l, h in pairs])
        per_ours, per_np = res["t_diagnostics"] / (n_layers * n_heads), t_np / len(pairs)
        agree = all(int(d.nulls.rank[l, h]) == rb and int(d.ov_rank[l, h]) == ro for (l, h), (rb, ro) in zip(pairs, ranks))
        res.update(per_head_ours=per_ours, per_head_numpy=per_np, numpy_heads_timed=len(pairs),
                   **{"ours/numpy": per_ours / per_np}, ranks_agree=agree)
        print(f"  diagnostics (weights only): {res['t_diagnostics']:.2f} s for all heads ({per_ours * 1e3:.1f} ms/head);"
              f" NumPy loop {per_np * 1e3:.1f} ms/head: ours/numpy = {per_ours / per_np:.3f}; ranks agree: {agree}",
              flush=True)

        report = os.path.join(tmp, "report")
        rc, res["t_command"] = timed(lambda: cli.main(["heads", folder, "--out", report]))
        res["command_ok"] = rc == 0
        res["under_10_s"] = res["t_command"] < 10.0
        print(f"  attngeom heads (read, analyse, heads.json and PNGs): {res['t_command']:.2f} s "
              f"({'under' if res['under_10_s'] else 'OVER'} the 10 s target)", flush=True)

    write(args.out, "bench_models", meta=meta, models=res)
    return 0 if res["command_ok"] and agree else 1


if __name__ == "__main__":
    sys.exit(main())
