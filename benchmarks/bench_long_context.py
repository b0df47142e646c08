"""A Qwen3-0.6B-shaped model's forward pass at long lengths: attngeom against transformers.

A random-init checkpoint with Qwen3-0.6B's shapes (hidden 1024, 28 layers, 16 query and 8
key/value heads of width 128, q_norm / k_norm, SwiGLU intermediate 3072, vocabulary 151,936,
tied embeddings; bfloat16 on disk, 1.2 GB) is written by ``transformers`` (save_pretrained)
in a child process. Then, for each length n, each of these runs in a fresh process on the
same n random token ids, float32, with the same thread count (--threads, default 2: the
children's attngeom, NumPy BLAS and torch counts are printed) for every library:

* ``attngeom``: ``model.forward(ids, keep=("attention_stats", "logits"), logits_at="last")``:
  every head's streaming statistics (entropy, sink mass, mean distance, ... per query) and
  the last position's logits, with no (n, n) weights formed;
* ``transformers_sdpa``: ``attn_implementation="sdpa"``, ``logits_to_keep=1``,
  ``use_cache=False`` (no weights, and no key/value cache: attngeom allocates none);
* ``transformers_eager``: ``output_attentions=True`` (every layer's weights, the peer way to
  get any attention statistic), ``use_cache=False``, only where its estimated memory fits.

Each process loads the model, runs the forward once (the warm-up) and then --repeats times
(default 3; the time is their median), and reports two memory figures: the peak resident
set of the process (VmHWM, loading included), and the activation memory, the peak while the
forwards ran minus the resident set right after loading (what the forward passes add to
the loaded model; the peak is reset after loading, so a loading transient, such as
transformers' bfloat16-to-float32 copy, does not count in it). attngeom maps the
checkpoint and reads each layer's bfloat16 pages as the forward reaches it, releasing them
after, so its activation figure includes about a layer of weights (and their float32 copy);
transformers holds all its float32 weights (2.4 GB) once loaded, outside that figure.
Ratios are against transformers' sdpa forward of the same length in the same run. The
lengths are 512, 2,048 and 8,192 tokens (add 32,768 with ``--long``; choose others with
``--lengths``; --quick: 512 and 2,048).

Gate: the last token's logits of attngeom (and of transformers' eager forward) are compared
with transformers' sdpa ones (harness.agree, relative to sdpa's largest logit); the exit
status is 1 beyond the tolerance, 1e-3. Two float32 forwards through 28 layers agree to
about 2e-6 at 512 tokens and 6e-6 at 2,048 (measured; eager to sdpa: 8e-7); the tolerance
leaves room for the longer sums of 32k tokens, and a wrong layer, rotary phase or mask
changes the logits in their first digit. A length whose process fails (out of memory,
say) fails the gate too.

  python benchmarks/bench_long_context.py [--out DIR] [--lengths 512 2048] [--long] [--threads 2] [--repeats R]
                                          [--libraries ...] [--quick]

Writes long_context.json to --out.
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile

import numpy as np

from harness import agree, fail, finish, machine, parse, parser, run_child

SHAPE = dict(hidden_size=1024, num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8, head_dim=128,
             intermediate_size=3072, vocab_size=151936)
TOLERANCE = 1e-3  # the last token's logits against transformers' sdpa, relative; see the docstring

WRITER = r"""
import sys, torch, transformers
config = transformers.Qwen3Config(**SHAPE, max_position_embeddings=40960, tie_word_embeddings=True,
                                  rope_theta=1000000.0, rms_norm_eps=1e-6)
torch.manual_seed(0)
model = transformers.Qwen3ForCausalLM(config).to(torch.bfloat16)
model.save_pretrained(sys.argv[1])
"""

CHILD = r"""  # run by harness.run_child, which defines SHAPE and BENCHMARKS
import json, sys
sys.path.insert(0, BENCHMARKS)
import attngeom as ag      # first: its thread settings reach NumPy's BLAS
import numpy as np
from harness import measure_forward

kind, folder, n, threads, repeats, logits_file = sys.argv[1:7]
n, threads, repeats = int(n), int(threads), int(repeats)
ids = np.random.default_rng(0).integers(0, SHAPE["vocab_size"], n)
ag.set_num_threads(threads)
if kind == "attngeom":
    result = measure_forward(lambda: ag.load_model(folder),
                             lambda model: model.forward(ids, keep=("attention_stats", "logits"), logits_at="last"),
                             lambda f: f.logits[-1], repeats, logits_file)
else:
    import torch, transformers
    torch.set_num_threads(threads)
    eager = kind == "transformers_eager"
    x = torch.tensor(ids)[None]

    def forward(model):
        with torch.inference_mode():
            return model(x, logits_to_keep=1, output_attentions=eager, use_cache=False)

    result = measure_forward(lambda: transformers.AutoModelForCausalLM.from_pretrained(
                                 folder, dtype=torch.float32, attn_implementation="eager" if eager else "sdpa"),
                             forward, lambda out: out.logits[0, -1].float().numpy(), repeats, logits_file)
print(json.dumps(result))
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


def table_line(n, kind, r) -> str:
    """One row of the printed table."""
    if "seconds" not in r:
        return f"{n:>7}  {kind:<19}  {r.get('skipped') or r.get('error')}"
    ratio = f"{r['speed_vs_sdpa']:.2f}x" if "speed_vs_sdpa" in r else "1 (anchor)"
    agreement = (f"{r['logits_vs_sdpa']['max_rel_error']:.1e} {'ok' if r['logits_vs_sdpa']['ok'] else 'DISAGREES'}"
                 if "logits_vs_sdpa" in r else "(anchor)")
    return (f"{n:>7}  {kind:<19}  {r['seconds']:>8.2f}  {ratio:>10}  {r['peak_rss_mb'] / 1024:>13.2f}  "
            f"{r['activation_mb'] / 1024:>16.2f}  {agreement}")


def main(argv=None):
    ap = parser(__doc__)
    ap.add_argument("--lengths", type=int, nargs="+", default=[512, 2048, 8192])
    ap.add_argument("--long", action="store_true", help="add 32,768 tokens")
    ap.add_argument("--threads", type=int, default=2, help="threads of every library (default 2)")
    ap.add_argument("--libraries", nargs="+", choices=KINDS, default=list(KINDS), help="which runs (default all)")
    args = parse(ap, argv)
    if "transformers_sdpa" not in args.libraries:
        ap.error("--libraries must include transformers_sdpa: it is the anchor every figure is compared with")
    lengths = ([512, 2048] if args.quick else args.lengths) + ([32768] if args.long else [])
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        writer = subprocess.run([sys.executable, "-c", "SHAPE = " + repr(SHAPE) + "\n" + WRITER, folder],
                                capture_output=True, text=True)
        if writer.returncode:
            sys.stderr.write(writer.stderr)
            raise SystemExit("writing the checkpoint with transformers failed")
        size = sum(os.path.getsize(os.path.join(folder, f)) for f in os.listdir(folder) if f.endswith(".safetensors"))
        print(f"Qwen3-0.6B-shaped checkpoint: {size / 1e9:.2f} GB bfloat16; {args.threads} threads for every "
              f"library; {cpu_name()}")
        print(f"one process per library and length: a warm-up forward, then the median of {args.repeats}; peak RSS "
              "of the process (loading included); activations = peak RSS while the forwards ran - RSS after "
              "loading; logits = the last token's, relative error against transformers_sdpa's")
        print("      n  library              time [s]  speed/sdpa  peak RSS [GB]  activations [GB]  logits rel err")
        threads_seen = {}
        for n in lengths:
            row = {"n": n}
            for kind in KINDS:
                if kind not in args.libraries:
                    row[kind] = {"skipped": "not asked for (--libraries)"}
                    continue
                if kind == "transformers_eager" and eager_bytes(n) > 0.8 * available_bytes():
                    row[kind] = {"skipped": f"needs about {eager_bytes(n) / 2 ** 30:.0f} GiB for the weights"}
                    continue
                row[kind] = run_child(CHILD, kind, folder, n, args.threads, args.repeats,
                                      os.path.join(folder, f"{kind}.npy"), threads=args.threads, SHAPE=SHAPE)
                threads_seen.setdefault(kind, row[kind].get("threads"))
            base = row["transformers_sdpa"]
            for kind in ("attngeom", "transformers_eager"):
                r = row[kind]
                if "seconds" in r and "seconds" in base:
                    r["speed_vs_sdpa"] = base["seconds"] / r["seconds"]
                    r["memory_vs_sdpa"] = r["peak_rss_mb"] / base["peak_rss_mb"]
                    r["activation_memory_vs_sdpa"] = r["activation_mb"] / base["activation_mb"]
                    r["logits_vs_sdpa"] = agree(f"n={n} {kind} last-token logits vs transformers_sdpa",
                                                np.load(os.path.join(folder, f"{kind}.npy")),
                                                np.load(os.path.join(folder, "transformers_sdpa.npy")),
                                                rtol=TOLERANCE, show=False)
            for kind in KINDS:
                if "error" in row[kind]:
                    fail(f"n={n} {kind}", f"its process failed: {row[kind]['error']}")
            a, e = row["attngeom"], row["transformers_eager"]
            if "seconds" in a and "seconds" in e:
                row["attngeom_vs_eager"] = {"speed": e["seconds"] / a["seconds"],
                                            "memory": e["peak_rss_mb"] / a["peak_rss_mb"],
                                            "activation_memory": e["activation_mb"] / a["activation_mb"]}
            rows.append(row)
            for kind in KINDS:
                print(table_line(n, kind, row[kind]), flush=True)
        for kind, counts in threads_seen.items():
            if counts:
                print(f"threads in the {kind} processes: " + ", ".join(f"{k} {v}" for k, v in counts.items()))
    return finish(args.out, "long_context", shape=SHAPE, checkpoint_bytes=size, cpu=cpu_name(),
                  meta=machine(threads_all=args.threads, repeats=args.repeats), threads=threads_seen, rows=rows)


if __name__ == "__main__":
    sys.exit(main())
