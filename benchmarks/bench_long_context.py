"""A Qwen3-0.6B-shaped model's forward pass at long lengths: attngeom against transformers.

A random-init checkpoint with Qwen3-0.6B's shapes (hidden 1024, 28 layers, 16 query and 8
key/value heads of width 128, q_norm / k_norm, SwiGLU intermediate 3072, vocabulary 151,936,
tied embeddings; bfloat16 on disk, 1.2 GB) is written by ``transformers`` (save_pretrained)
in a child process. Then, for each length n, each of these runs in a fresh process on the
same n random token ids, float32, with the same thread count (default 2) for every library:

* ``attngeom``: ``model.forward(ids, keep=("attention_stats", "logits"), logits_at="last")``:
  every head's streaming statistics (entropy, sink mass, mean distance, ... per query) and
  the last position's logits, with no (n, n) weights formed;
* ``transformers_sdpa``: ``attn_implementation="sdpa"``, ``logits_to_keep=1`` (no weights);
* ``transformers_eager``: ``output_attentions=True`` (every layer's weights, the peer way to
  get any attention statistic), only where its estimated memory fits.

Each process reports the forward's wall time and its peak resident set size (ru_maxrss; the
mapped checkpoint pages it touches count in it). Ratios are against transformers' sdpa
forward of the same length in the same run. The lengths are 512, 2,048 and 8,192 tokens
(add 32,768 with ``--long``; choose others with ``--lengths``).

  python benchmarks/bench_long_context.py [--out DIR] [--lengths 512 2048] [--long] [--threads 2]

Writes long_context.json to --out.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

from harness import machine, parser, write

SHAPE = dict(hidden_size=1024, num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8, head_dim=128,
             intermediate_size=3072, vocab_size=151936)

WRITER = r"""
import sys, torch, transformers
config = transformers.Qwen3Config(**SHAPE, max_position_embeddings=40960, tie_word_embeddings=True,
                                  rope_theta=1000000.0, rms_norm_eps=1e-6)
torch.manual_seed(0)
model = transformers.Qwen3ForCausalLM(config).to(torch.bfloat16)
model.save_pretrained(sys.argv[1])
"""

CHILD = r"""
import json, os, resource, sys, time
import attngeom as ag      # first: its thread settings reach NumPy's BLAS
import numpy as np

kind, folder, n, threads = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
ids = np.random.default_rng(0).integers(0, SHAPE["vocab_size"], n)
if kind == "attngeom":
    ag.set_num_threads(threads)
    model = ag.load_model(folder)
    t0 = time.perf_counter()
    f = model.forward(ids, keep=("attention_stats", "logits"), logits_at="last")
    seconds = time.perf_counter() - t0
    assert f.logits.shape == (1, SHAPE["vocab_size"]) and np.isfinite(f.attention_stats.entropy).all()
    extra = {"entropy_mean": float(f.attention_stats.entropy.mean())}
else:
    import torch, transformers
    torch.set_num_threads(threads)
    eager = kind == "transformers_eager"
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32,
                                                              attn_implementation="eager" if eager else "sdpa")
    x = torch.tensor(ids)[None]
    with torch.inference_mode():
        t0 = time.perf_counter()
        out = model(x, logits_to_keep=1, output_attentions=eager)
        seconds = time.perf_counter() - t0
    extra = {}
print(json.dumps({"seconds": seconds, "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  **extra}))
"""


KINDS = ("attngeom", "transformers_sdpa", "transformers_eager")


def eager_bytes(n: int) -> int:
    """transformers' eager forward with output_attentions: every layer's (16, n, n) float32
    weights kept, and about three more (16, n, n) arrays while a layer runs."""
    return (SHAPE["num_hidden_layers"] + 3) * SHAPE["num_attention_heads"] * n * n * 4


def available_bytes() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


def cpu_name() -> str:
    fields = {}
    with open("/proc/cpuinfo") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key.strip() in ("model name", "cpu family", "model") and key.strip() not in fields:
                fields[key.strip()] = value.strip()
            if len(fields) == 3:
                break
    return f"{fields.get('model name')} (cpu family {fields.get('cpu family')} model {fields.get('model')})"


def run(kind: str, folder: str, n: int, threads: int) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    code = "SHAPE = " + repr(SHAPE) + "\n" + CHILD
    p = subprocess.run([sys.executable, "-c", code, kind, folder, str(n), str(threads)], capture_output=True,
                       text=True, env=env)
    if p.returncode:
        return {"error": (p.stderr.strip().splitlines() or [f"exit code {p.returncode}"])[-1]}
    return json.loads(p.stdout.strip().splitlines()[-1])


def main(argv=None):
    ap = parser(__doc__, repeats=None)
    ap.add_argument("--lengths", type=int, nargs="+", default=[512, 2048, 8192])
    ap.add_argument("--long", action="store_true", help="add 32,768 tokens")
    ap.add_argument("--threads", type=int, default=2, help="threads of every library (default 2)")
    ap.add_argument("--libraries", nargs="+", choices=KINDS, default=list(KINDS), help="which runs (default all)")
    args = ap.parse_args(argv)
    lengths = args.lengths + ([32768] if args.long else [])
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        writer = subprocess.run([sys.executable, "-c", "SHAPE = " + repr(SHAPE) + "\n" + WRITER, folder],
                                capture_output=True, text=True)
        if writer.returncode:
            sys.stderr.write(writer.stderr)
            raise SystemExit("writing the checkpoint with transformers failed")
        size = sum(os.path.getsize(os.path.join(folder, f)) for f in os.listdir(folder) if f.endswith(".safetensors"))
        print(f"Qwen3-0.6B-shaped checkpoint: {size / 1e9:.2f} GB bfloat16; {args.threads} threads; {cpu_name()}")
        for n in lengths:
            row = {"n": n}
            for kind in KINDS:
                if kind not in args.libraries:
                    row[kind] = {"skipped": "not asked for (--libraries)"}
                    continue
                if kind == "transformers_eager" and eager_bytes(n) > 0.8 * available_bytes():
                    row[kind] = {"skipped": f"needs about {eager_bytes(n) / 2 ** 30:.0f} GiB for the weights"}
                    continue
                row[kind] = run(kind, folder, n, args.threads)
            base = row["transformers_sdpa"]
            for kind in ("attngeom", "transformers_eager"):
                r = row[kind]
                if "seconds" in r and "seconds" in base:
                    r["speed_vs_sdpa"] = base["seconds"] / r["seconds"]
                    r["memory_vs_sdpa"] = r["peak_rss_mb"] / base["peak_rss_mb"]
            a, e = row["attngeom"], row["transformers_eager"]
            if "seconds" in a and "seconds" in e:
                row["attngeom_vs_eager"] = {"speed": e["seconds"] / a["seconds"],
                                            "memory": e["peak_rss_mb"] / a["peak_rss_mb"]}
            rows.append(row)
            cells = []
            for kind in KINDS:
                r = row[kind]
                cells.append(f"{kind} " + (f"{r['seconds']:.1f} s / {r['peak_rss_mb'] / 1024:.2f} GB" if "seconds" in r
                                           else r.get("skipped") or r.get("error")))
            ratio = row["attngeom"].get("speed_vs_sdpa")
            print(f"n = {n:6d}: " + "; ".join(cells) + (f"; attngeom {ratio:.2f}x sdpa's speed" if ratio else ""),
                  flush=True)
    write(args.out, "long_context", shape=SHAPE, checkpoint_bytes=size, cpu=cpu_name(),
          **machine(threads_all=args.threads), rows=rows)
    return rows


if __name__ == "__main__":
    main()
