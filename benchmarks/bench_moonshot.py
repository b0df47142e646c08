"""The moonshot: every head's statistics of a Llama-3-8B-shaped model over 32,768 tokens.

A checkpoint with Llama-3-8B's exact shapes (32 layers of hidden 4,096, 32 query and 8
key/value heads of width 128, SwiGLU intermediate 14,336, vocabulary 128,256, untied
unembedding; random bfloat16 weights of standard deviation 0.02, norms one) is written
tensor by tensor with NumPy into one safetensors file (about 16 GB for 32 layers; never
whole in memory: each tensor is generated and written in blocks of rows). Then one process
runs ``model.forward(ids, keep=("attention_stats", "logits"), logits_at="last",
dtype=...)`` on --tokens random ids (default 32,768) and reports the wall time, the peak
resident set (VmHWM) and the peak of its anonymous part (sampled every 0.2 s: the memory
beyond the mapped checkpoint's pages, which the pass releases after each layer).

``--layers K`` writes and runs a K-layer slice with the exact layer shapes and prints the
32-layer extrapolation: the embedding and unembedding once, the per-layer time times 32
(the layers are alike). ``--check`` also runs the first layer in float32 and compares its
entropies with the bfloat16 pass's (the largest difference, in nats; gate 0.05: measured
0.024 at 32,768 tokens on Zen 5, while a wrong layer, mask or rotation moves entropies by
nats).
Every run checks that each causal row's entropy is at most log(i + 1) for row i, which sees
i + 1 keys (within 1e-3 nats of float32 rounding; a mask that lets rows see later keys
exceeds it by nats).

  python benchmarks/bench_moonshot.py [--out DIR] [--layers K] [--tokens N] [--dtype bfloat16|float32]
                                      [--threads T] [--check] [--keep-file DIR] [--quick]

--quick: a 1-layer slice at 2,048 tokens (a check of the script, not a measurement).
Writes moonshot.json to --out.
"""
from __future__ import annotations

import json
import os
import struct
import sys
import tempfile
import threading
import time

import numpy as np

from harness import agree, build_line, cpu_name, finish, machine, parse, parser

import attngeom as ag
from attngeom import _core

SHAPE = dict(hidden_size=4096, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
             intermediate_size=14336, vocab_size=128256)
ENTROPY_GATE = 0.05  # nats: the first layer's entropies, bfloat16 against float32 (docstring)
ENTROPY_BOUND_SLACK = 1e-3  # nats: float32 rounding of an entropy of up to log(32,768) = 10.4 nats


def tensors(layers: int):
    """(name, shape) of every tensor of a Llama checkpoint with SHAPE and `layers` layers."""
    d, ff, V = SHAPE["hidden_size"], SHAPE["intermediate_size"], SHAPE["vocab_size"]
    H, K, dh = SHAPE["num_attention_heads"], SHAPE["num_key_value_heads"], SHAPE["head_dim"]
    out = [("model.embed_tokens.weight", (V, d))]
    for i in range(layers):
        p = f"model.layers.{i}."
        out += [(p + "input_layernorm.weight", (d,)), (p + "self_attn.q_proj.weight", (H * dh, d)),
                (p + "self_attn.k_proj.weight", (K * dh, d)), (p + "self_attn.v_proj.weight", (K * dh, d)),
                (p + "self_attn.o_proj.weight", (d, H * dh)), (p + "post_attention_layernorm.weight", (d,)),
                (p + "mlp.gate_proj.weight", (ff, d)), (p + "mlp.up_proj.weight", (ff, d)),
                (p + "mlp.down_proj.weight", (d, ff))]
    return out + [("model.norm.weight", (d,)), ("lm_head.weight", (V, d))]


def write_checkpoint(folder: str, layers: int, seed: int = 0) -> int:
    """config.json and model.safetensors (BF16), written tensor by tensor in blocks of rows;
    returns the file's size in bytes."""
    config = dict(SHAPE, num_hidden_layers=layers, architectures=["LlamaForCausalLM"], model_type="llama",
                  max_position_embeddings=131072, rope_theta=500000.0, rms_norm_eps=1e-5, hidden_act="silu",
                  tie_word_embeddings=False, torch_dtype="bfloat16", attention_bias=False, mlp_bias=False)
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(config, f, indent=1)
    header, offset = {}, 0
    for name, shape in tensors(layers):
        n = int(np.prod(shape)) * 2
        header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [offset, offset + n]}
        offset += n
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    rng = np.random.default_rng(seed)
    path = os.path.join(folder, "model.safetensors")
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        for name, shape in tensors(layers):
            if len(shape) == 1:  # norms: one
                f.write(_core.round_bf16(np.ones(shape, np.float32)).tobytes())
                continue
            step = max(1, (1 << 24) // shape[1])
            for lo in range(0, shape[0], step):
                block = rng.standard_normal((min(step, shape[0] - lo), shape[1]), dtype=np.float32)
                block *= 0.02
                f.write(_core.round_bf16(block).tobytes())
    return os.path.getsize(path)


class AnonPeak:
    """The peak of RssAnon (/proc/self/status), sampled every 0.2 s on a thread."""

    def __init__(self):
        self.peak, self._stop = 0.0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _read(self) -> float:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("RssAnon:"):
                    return int(line.split()[1]) / 1024
        return 0.0

    def _run(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, self._read())
            self._stop.wait(0.2)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self._read())


def peak_rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return 0.0


def main(argv=None):
    ap = parser(__doc__, repeats=None)
    ap.add_argument("--layers", type=int, default=32, help="layers of the slice (default all 32)")
    ap.add_argument("--tokens", type=int, default=32768)
    ap.add_argument("--dtype", choices=("bfloat16", "float32"), default="bfloat16")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--check", action="store_true", help="the first layer's entropies against a float32 pass")
    ap.add_argument("--keep-file", metavar="DIR", help="write (or reuse) the checkpoint in DIR instead of a temporary one")
    args = parse(ap, argv)
    layers, n = (1, 2048) if args.quick else (args.layers, args.tokens)
    ag.set_num_threads(args.threads)
    context = tempfile.TemporaryDirectory() if args.keep_file is None else None
    folder = context.name if context is not None else args.keep_file
    os.makedirs(folder, exist_ok=True)
    try:
        t0 = time.perf_counter()
        path = os.path.join(folder, "model.safetensors")
        ok = os.path.exists(path) and json.load(open(os.path.join(folder, "config.json")))["num_hidden_layers"] == layers
        size = os.path.getsize(path) if ok else write_checkpoint(folder, layers)
        written = time.perf_counter() - t0
        print(f"Llama-3-8B-shaped checkpoint, {layers} of 32 layers: {size / 1e9:.1f} GB bfloat16 "
              f"({'reused' if ok else f'written in {written:.0f} s'}); {n} tokens, {args.dtype}, {args.threads} "
              f"threads; {cpu_name()}; {build_line()}")
        model = ag.load_model(folder)
        ids = np.random.default_rng(1).integers(0, SHAPE["vocab_size"], n)
        with AnonPeak() as anon:
            t0 = time.perf_counter()
            f = model.forward(ids, keep=("attention_stats", "logits"), logits_at="last", dtype=args.dtype)
            seconds = time.perf_counter() - t0
        assert np.all(np.isfinite(f.logits)) and f.attention_stats.entropy.shape == (layers, 32, n)
        # the embedding lookup and the last position's unembedding are once per pass, not per layer
        t0 = time.perf_counter()
        model.forward(ids[:1], keep=("logits",), logits_at="last", layers=[0], dtype=args.dtype)
        fixed = time.perf_counter() - t0
        per_layer = max(seconds - fixed, 0.0) / layers
        whole = fixed + 32 * per_layer
        result = dict(layers=layers, tokens=n, dtype=args.dtype, threads=args.threads, seconds=seconds,
                      seconds_per_layer=per_layer, seconds_32_layers=whole if layers < 32 else seconds,
                      extrapolated=layers < 32, peak_rss_mb=peak_rss_mb(), peak_anon_mb=anon.peak,
                      checkpoint_bytes=size)
        print(f"forward: {seconds:.1f} s ({per_layer:.1f} s per layer); 32 layers: {result['seconds_32_layers'] / 60:.1f} "
              f"min{' (extrapolated)' if layers < 32 else ''}; peak RSS {result['peak_rss_mb'] / 1024:.2f} GB, of it "
              f"anonymous (beyond the mapped checkpoint) {anon.peak / 1024:.2f} GB")
        # A causal row i sees i + 1 keys, so its entropy is at most log(i + 1): the largest excess
        # of each layer's heads (a mask that lets a row see later keys exceeds it by nats).
        excess = np.max(f.attention_stats.entropy - np.log1p(np.arange(n, dtype=np.float64)), axis=-1)
        result["entropy_bound"] = agree("entropies within log(i + 1) of a causal row i", excess, np.zeros_like(excess),
                                        rtol=0.0, atol=ENTROPY_BOUND_SLACK, above_only=True)
        if args.check:
            other = "float32" if args.dtype == "bfloat16" else "bfloat16"
            g = model.forward(ids, keep=("attention_stats",), layers=[0], dtype=other)
            a, b = f.attention_stats.entropy[0], g.attention_stats.entropy[0]
            result["first_layer_entropy"] = agree(f"first layer's entropies, {args.dtype} vs {other}", a, b,
                                                  rtol=0.0, atol=ENTROPY_GATE)
        return finish(args.out, "moonshot", meta=machine(threads_all=args.threads), **result)
    finally:
        if context is not None:
            context.cleanup()


if __name__ == "__main__":
    sys.exit(main())
