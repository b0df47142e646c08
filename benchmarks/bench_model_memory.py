"""Peak memory of a 0.5B-parameter bfloat16 decoder's forward pass on 128 tokens.

A random-init checkpoint with Qwen2.5-0.5B's shapes (Qwen2 layout: hidden 896, 24 layers,
14 query heads and 2 key/value heads of width 64, q/k/v biases, SwiGLU intermediate 4864,
vocabulary 151936, tied embeddings: 494M parameters, 0.99 GB in bfloat16) is written to a
temporary folder by one child process. A second one runs ``ag.load_model(folder)`` and
``model.forward(ids)`` on 128 tokens in float32 and reports its peak resident set size
(``resource.getrusage(RUSAGE_SELF).ru_maxrss``, and the kernel's VmHWM). The checkpoint is
written in its own process because Linux carries ru_maxrss across fork and exec: a child
started by a process that had grown to several GB would report the parent's size. The
issue's target is under 3 GB.

The weights are memory-mapped, so the file pages the forward pass touches (about the
checkpoint's 0.99 GB) count in the resident set; the rest is each layer's float32 copy,
the activations and the interpreter.

  python benchmarks/bench_model_memory.py [--out DIR] [--tokens N] [--layers L]

Writes model_memory.json to --out (default the current folder).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time

import numpy as np

from attngeom.models import BFloat16Array, float32_to_bfloat16, write_safetensors

SHAPE = dict(hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
             intermediate_size=4864, vocab_size=151936)

CHILD = r"""
import json, resource, sys, time
import numpy as np
import attngeom as ag

def peak_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # kB on Linux

def status():
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmHWM", "VmRSS", "RssAnon", "RssFile"):
                out[key] = int(value.split()[0]) / 1024
    return out

folder, n = sys.argv[1], int(sys.argv[2])
start = peak_mb()
t0 = time.perf_counter()
model = ag.load_model(folder)
t_load = time.perf_counter() - t0
after_load = peak_mb()
ids = np.random.default_rng(0).integers(0, model.arch.vocab_size, size=n)
t0 = time.perf_counter()
f = model.forward(ids, dtype=np.float32)
t_forward = time.perf_counter() - t0
assert f.logits.shape == (n, model.arch.vocab_size) and np.isfinite(f.logits).all()
print(json.dumps({"peak_rss_mb_after_import": start, "peak_rss_mb_after_load": after_load,
                  "peak_rss_mb": peak_mb(), "load_s": t_load, "forward_s": t_forward, "status_mb": status()}))
"""


def write_checkpoint(folder, layers, seed=0):
    """A random bfloat16 checkpoint of SHAPE (with `layers` layers) and its config.json."""
    c = dict(SHAPE, num_hidden_layers=layers)
    d, H, K, ff, V = (c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"], c["intermediate_size"],
                      c["vocab_size"])
    dh = d // H
    rng = np.random.default_rng(seed)

    def bf16(*shape, scale=None):
        s = 1 / np.sqrt(shape[-1]) if scale is None else scale
        return BFloat16Array(float32_to_bfloat16(rng.standard_normal(shape, dtype=np.float32) * np.float32(s)))

    t = {"model.embed_tokens.weight": bf16(V, d, scale=0.02), "model.norm.weight": bf16(d, scale=0.1)}
    for i in range(layers):
        p = f"model.layers.{i}."
        t.update({
            p + "input_layernorm.weight": bf16(d, scale=0.1), p + "post_attention_layernorm.weight": bf16(d, scale=0.1),
            p + "self_attn.q_proj.weight": bf16(H * dh, d), p + "self_attn.q_proj.bias": bf16(H * dh, scale=0.02),
            p + "self_attn.k_proj.weight": bf16(K * dh, d), p + "self_attn.k_proj.bias": bf16(K * dh, scale=0.02),
            p + "self_attn.v_proj.weight": bf16(K * dh, d), p + "self_attn.v_proj.bias": bf16(K * dh, scale=0.02),
            p + "self_attn.o_proj.weight": bf16(d, H * dh),
            p + "mlp.gate_proj.weight": bf16(ff, d), p + "mlp.up_proj.weight": bf16(ff, d),
            p + "mlp.down_proj.weight": bf16(d, ff),
        })
    os.makedirs(folder, exist_ok=True)
    write_safetensors(os.path.join(folder, "model.safetensors"), t)
    config = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_act": "silu",
              "max_position_embeddings": 32768, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
              "tie_word_embeddings": True, "torch_dtype": "bfloat16", "use_sliding_window": False, **c}
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(config, f, indent=1)
    return sum(a.size for a in t.values())


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=".")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--layers", type=int, default=SHAPE["num_hidden_layers"])
    ap.add_argument("--write-only", metavar="FOLDER", help=argparse.SUPPRESS)  # the writer child
    args = ap.parse_args(argv)
    if args.write_only:
        print(write_checkpoint(args.write_only, args.layers))
        return None
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        writer = subprocess.run([sys.executable, os.path.abspath(__file__), "--write-only", tmp, "--layers",
                                 str(args.layers)], capture_output=True, text=True)
        if writer.returncode:
            sys.stderr.write(writer.stderr)
            raise SystemExit(f"writing the checkpoint failed (exit code {writer.returncode})")
        params = int(writer.stdout.split()[-1])
        size = os.path.getsize(os.path.join(tmp, "model.safetensors"))
        print(f"checkpoint: {params / 1e6:.1f}M parameters, {size / 1e9:.3f} GB bfloat16 "
              f"({time.perf_counter() - t0:.1f} s to write)", flush=True)
        run = subprocess.run([sys.executable, "-c", CHILD, tmp, str(args.tokens)], capture_output=True, text=True)
        if run.returncode:
            sys.stderr.write(run.stderr)
            raise SystemExit(f"the forward pass failed (exit code {run.returncode})")
        child = json.loads(run.stdout.strip().splitlines()[-1])
    children_peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024  # the larger of the two children
    result = {"shape": dict(SHAPE, num_hidden_layers=args.layers), "dtype": "bfloat16", "parameters": params,
              "checkpoint_bytes": size, "tokens": args.tokens, "compute_dtype": "float32",
              "peak_rss_mb": child["peak_rss_mb"], "peak_rss_mb_rusage_children": children_peak,
              "peak_rss_mb_after_load": child["peak_rss_mb_after_load"],
              "peak_rss_mb_after_import": child["peak_rss_mb_after_import"], "final_status_mb": child["status_mb"],
              "load_s": child["load_s"], "forward_s": child["forward_s"], "target_mb": 3000,
              "python": platform.python_version(), "machine": platform.machine()}
    print(f"peak RSS of the forward process: {child['peak_rss_mb']:.0f} MB, VmHWM "
          f"{child['status_mb']['VmHWM']:.0f} MB (after import "
          f"{child['peak_rss_mb_after_import']:.0f} MB, after load {child['peak_rss_mb_after_load']:.0f} MB); "
          f"load {child['load_s']:.2f} s, forward on {args.tokens} tokens {child['forward_s']:.1f} s; "
          f"at exit {child['status_mb']}")
    print(f"target < 3000 MB: {'met' if child['peak_rss_mb'] < 3000 else 'NOT met'}")
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "model_memory.json"), "w") as f:
        json.dump(result, f, indent=1)
    return result


if __name__ == "__main__":
    main()
