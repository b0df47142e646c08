"""A Qwen3-0.6B-shaped model's forward pass at long lengths: attngeom against transformers,
in float32 and in bfloat16.

A random-init checkpoint with Qwen3-0.6B's shapes (hidden 1024, 28 layers, 16 query and 8
key/value heads of width 128, q_norm / k_norm, SwiGLU intermediate 3072, vocabulary 151,936,
tied embeddings; bfloat16 on disk, 1.2 GB) is written by ``transformers`` (save_pretrained)
in a child process. Then, for each length n and thread count (--threads, default 1 and 2:
the children's attngeom, NumPy BLAS and torch counts are printed), each of these runs in a
fresh process on the same n random token ids:

* ``attngeom``: ``model.forward(ids, keep=("attention_stats", "logits"), logits_at="last")``
  in float32: every head's streaming statistics (entropy, sink mass, mean distance, ... per
  query) and the last position's logits, with no (n, n) weights formed;
* ``attngeom_bf16``: the same with ``dtype="bfloat16"`` (bfloat16 products with float32
  sums on the CPU's bfloat16 dot products, attention on bfloat16 q, k, v with float32
  scores and statistics, norms and residuals in float32);
* ``transformers_sdpa``: float32, ``attn_implementation="sdpa"``, ``logits_to_keep=1``,
  ``use_cache=False`` (no weights, and no key/value cache: attngeom allocates none); the
  anchor of every speed ratio;
* ``transformers_bf16``: the same loaded with ``dtype=torch.bfloat16``, the way a bfloat16
  checkpoint is usually run (every activation in bfloat16, oneDNN's bfloat16 products);
* ``llama_cpp_f32`` / ``llama_cpp_bf16``: llama.cpp (llama-cpp-python) on the same weights
  written as GGUF with the ``gguf`` package (float32, or bfloat16 matrices with float32
  norms; no tokenizer, ids fed directly), flash attention on, its default float16 key/value
  cache, ``n_ctx = n_batch = n``; skipped with a message where llama_cpp or gguf is not
  installed;
* ``transformers_eager``: float32, ``output_attentions=True`` (every layer's weights, the
  peer way to get any attention statistic), ``use_cache=False``, only where its estimated
  memory fits (and only at the largest thread count); where it does not fit beside the
  other libraries' processes it runs alone after them, its ratio then one of medians;
* ``reference``: attngeom in float64, one forward, for the logits' errors (not timed; off
  with --no-reference).

Both attngeom runs load with ``keep_weights=True`` (repeated passes keep the layers'
weights, as transformers keeps its loaded model; ``--release-weights`` measures the default,
which releases a mapped checkpoint's pages after each layer).

Each process loads the model and runs the forward once (the warm-up); the processes of one
length and thread count are all resident at once and take turns (harness.run_in_turns):
--repeats rounds (default 3), each library one timed forward per round while the others
wait, in an order rotated each round. A library's time is the median of its forwards; a
speed ratio is the median over rounds of the two libraries' ratio in that round, so a slow
spell of a shared machine cancels; the CPU time the waiting processes took during a forward
is reported (it should be near 0). Each process reports two memory figures: its peak
resident set (VmHWM, loading included), and the activation memory, the peak while the
forwards ran minus the resident set right after loading. Speeds are ratios against
transformers' float32 sdpa forward of the same length and thread count in the same run, and
each attngeom run's against its peers in its dtype (transformers and llama.cpp). Each engine's last-token logits are compared
with the float64 reference: the largest error relative to the reference's largest logit,
and whether the top token agrees. The lengths are 512, 2,048 and 8,192 tokens (add 32,768
with ``--long``; choose others with ``--lengths``; --quick: 512 and 2,048 at 2 threads).

With --scaling the libraries are not compared with each other but each with itself over
thread counts: for each length, the processes of every asked library (default attngeom and
attngeom_bf16) at every --threads count are resident at once and take turns as above, and a
library's speed-up from the fewest threads to each other count is the median over rounds of
that round's ratio (so a slow spell cancels, as for the ratios between libraries). Its gate:
attngeom's logits are the same bits at every thread count, another library's agree with its
fewest-threads run to the float32 tolerance below.

Gates: attngeom's float32 logits against transformers' sdpa ones (harness.agree, relative to
sdpa's largest logit, tolerance 1e-3: two float32 forwards through 28 layers agree to about
2e-6 at 512 tokens and 6e-6 at 2,048, and a wrong layer, rotary phase or mask changes the
logits in their first digit), and attngeom_bf16's logits against the float64 reference with
transformers_bf16's own error there as the tolerance (at least 5e-3 of the largest logit:
bfloat16 keeps 8 significant bits; a run without transformers_bf16 reports attngeom_bf16's
error ungated); the exit status is 1 beyond either. A length whose
process fails (out of memory, say) fails the gate too.

  python benchmarks/bench_long_context.py [--out DIR] [--lengths 512 2048] [--long] [--threads 1 2]
                                          [--repeats R] [--libraries ...] [--no-reference]
                                          [--release-weights] [--quick] [--scaling]

Writes long_context.json to --out.
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile

import numpy as np

from harness import (agree, build_line, cpu_name, fail, finish, machine, parse, parser, round_ratio, run_child,
                     run_in_turns)

SHAPE = dict(hidden_size=1024, num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8, head_dim=128,
             intermediate_size=3072, vocab_size=151936)
TOLERANCE = 1e-3  # the last token's logits against transformers' sdpa, relative; see the docstring
BF16_FLOOR = 5e-3  # the least tolerance of attngeom_bf16 against the float64 reference, relative

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

kind, folder, n, threads, repeats, logits_file, keep_weights, turns = sys.argv[1:9]
n, threads, repeats, keep_weights, turns = int(n), int(threads), int(repeats), keep_weights == "1", turns == "1"
ids = np.random.default_rng(0).integers(0, SHAPE["vocab_size"], n)
ag.set_num_threads(threads)
if kind.startswith("attngeom") or kind == "reference":
    dtype = {"attngeom": np.float32, "attngeom_bf16": "bfloat16", "reference": np.float64}[kind]
    result = measure_forward(lambda: ag.load_model(folder, keep_weights=keep_weights),
                             lambda model: model.forward(ids, keep=("attention_stats", "logits"), logits_at="last",
                                                         dtype=dtype),
                             lambda f: f.logits[-1], repeats, logits_file, turns=turns)
elif kind.startswith("llama_cpp"):
    import llama_cpp
    from llama_cpp import Llama

    def load():
        return Llama(model_path=folder + f"/{kind}.gguf", n_ctx=n, n_batch=n, n_threads=threads,
                     n_threads_batch=threads, flash_attn=True, verbose=False)

    def forward(llm):
        llm.reset()  # the next eval computes every position again
        llm.eval(ids.tolist())  # logits of the last position only (as logits_to_keep=1)
        return np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm.ctx, -1), shape=(llm.n_vocab(),)).copy()

    result = measure_forward(load, forward, lambda out: out, repeats, logits_file, turns=turns)
else:
    import torch, transformers
    torch.set_num_threads(threads)
    eager = kind == "transformers_eager"
    dtype = torch.bfloat16 if kind == "transformers_bf16" else torch.float32
    x = torch.tensor(ids)[None]

    def forward(model):
        with torch.inference_mode():
            return model(x, logits_to_keep=1, output_attentions=eager, use_cache=False)

    result = measure_forward(lambda: transformers.AutoModelForCausalLM.from_pretrained(
                                 folder, dtype=dtype, attn_implementation="eager" if eager else "sdpa"),
                             forward, lambda out: out.logits[0, -1].float().numpy(), repeats, logits_file,
                             turns=turns)
print(json.dumps(result))
"""


KINDS = ("attngeom", "attngeom_bf16", "transformers_sdpa", "transformers_bf16", "llama_cpp_f32", "llama_cpp_bf16",
         "transformers_eager")
PEERS = {"attngeom": ("transformers_sdpa", "llama_cpp_f32"),  # each attngeom run: its peers in its dtype
         "attngeom_bf16": ("transformers_bf16", "llama_cpp_bf16")}

GGUF_WRITER = r"""  # run by harness.run_child: the checkpoint as GGUF for llama.cpp (qwen3, no tokenizer)
import json, sys
import gguf, numpy as np
from attngeom.models import float32_to_bfloat16, read_safetensors

folder, path, kind = sys.argv[1:4]
c = json.load(open(folder + "/config.json"))
t = read_safetensors(folder + "/model.safetensors")
w = gguf.GGUFWriter(path, "qwen3")
w.add_block_count(c["num_hidden_layers"])
w.add_context_length(c["max_position_embeddings"])
w.add_embedding_length(c["hidden_size"])
w.add_feed_forward_length(c["intermediate_size"])
w.add_head_count(c["num_attention_heads"])
w.add_head_count_kv(c["num_key_value_heads"])
w.add_key_length(c["head_dim"])
w.add_value_length(c["head_dim"])
w.add_rope_freq_base(c["rope_theta"] if "rope_theta" in c else c["rope_parameters"]["rope_theta"])
w.add_layer_norm_rms_eps(c["rms_norm_eps"])
w.add_vocab_size(c["vocab_size"])
w.add_tokenizer_model("none")
w.add_file_type(gguf.LlamaFileType.MOSTLY_BF16 if kind == "bf16" else gguf.LlamaFileType.ALL_F32)
names = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight"}
roles = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
         "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm",
         "self_attn.k_norm": "attn_k_norm", "post_attention_layernorm": "ffn_norm", "mlp.gate_proj": "ffn_gate",
         "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
for i in range(c["num_hidden_layers"]):
    for role, name in roles.items():
        names[f"model.layers.{i}.{role}.weight"] = f"blk.{i}.{name}.weight"
for ours, theirs in names.items():
    a = np.asarray(t.pop(ours), np.float32)
    if a.ndim == 2 and kind == "bf16":
        w.add_tensor(theirs, float32_to_bfloat16(a), raw_dtype=gguf.GGMLQuantizationType.BF16)
    else:
        w.add_tensor(theirs, a)
w.write_header_to_file()
w.write_kv_data_to_file()
w.write_tensors_to_file()
w.close()
print(json.dumps({"ok": True}))
"""


#: Why transformers_eager leaves the turns: its weights do not fit beside the other libraries'
#: processes, so it runs after them, alone, and its ratio is one of medians (``timed_alone``).
EAGER_ALONE = "runs alone after the others: its weights do not fit beside them"


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


def table_line(n, threads, kind, r) -> str:
    """One row of the printed table."""
    if "seconds" not in r:
        return f"{n:>7}  {threads:>2}  {kind:<19}  {r.get('skipped') or r.get('error')}"
    if r["seconds"] is None:  # the float64 reference: one untimed forward
        return f"{n:>7}  {threads:>2}  {kind:<19}  {'-':>8}  {'(reference)':>11}  {r['peak_rss_mb'] / 1024:>8.2f}"
    ratio = f"{r['speed_vs_sdpa']:.2f}x" if "speed_vs_sdpa" in r else "1 (anchor)"
    peer = " ".join(f"{v:.2f}x" for v in r.get("speed_vs", {}).values())
    error = r.get("logits_vs_reference")
    error = f"{error['max_rel_error']:.1e} {'top-1 ok' if error['top1'] else 'top-1 differs'}" if error else ""
    if "skipped" in r.get("logits_vs_reference_gate", {}):
        error += " (ungated: no transformers_bf16)"
    if r.get("timed_alone"):
        error += " (timed alone: its ratio is one of medians)"
    return (f"{n:>7}  {threads:>2}  {kind:<19}  {r['seconds']:>8.2f}  {ratio:>11}  {peer:>13}  "
            f"{r['peak_rss_mb'] / 1024:>8.2f}  {r['activation_mb'] / 1024:>11.2f}  {error}")


def llama_cpp_missing():
    """None when llama-cpp-python and gguf import, else why the llama.cpp runs are skipped."""
    for module in ("llama_cpp", "gguf"):
        try:
            __import__(module)
        except ImportError:
            return f"{module} is not installed (pip install llama-cpp-python gguf)"
    return None


def reference_error(ours: np.ndarray, reference: np.ndarray) -> dict:
    """The largest error of `ours` relative to the reference's largest logit, and top-1 agreement."""
    scale = float(np.max(np.abs(reference)))
    return {"max_abs_error": float(np.max(np.abs(ours - reference))),
            "max_rel_error": float(np.max(np.abs(ours - reference))) / scale,
            "top1": bool(np.argmax(ours) == np.argmax(reference))}


def print_busy(results: dict) -> None:
    """A line naming the runs (name -> run_in_turns result) during whose forwards the waiting
    processes took more than 5% of a CPU; nothing when they were idle."""
    busy = {name: r["others_cpu"] for name, r in results.items() if r.get("others_cpu", 0) > 0.05}
    if busy:
        print("  the waiting processes were not idle during these forwards (share of a CPU): " +
              ", ".join(f"{name} {v:.2f}" for name, v in busy.items()))


def scaling_rows(args, folder, lengths, thread_counts, keep, llama) -> list:
    """--scaling: per length, every asked library at every thread count, all resident and
    taking turns; each run's speed-up over the same library at the fewest threads (the median
    of the rounds' ratios), with its per-round ratios, and the gate on its logits."""
    fewest = thread_counts[0]
    print(f"one process per library and thread count, all resident, a warm-up forward each, then {args.repeats} "
          f"rounds of one forward each in turn: time = its median; speed-up = the median over rounds of the time "
          f"at {fewest} thread(s) / the time at this count, per-round ratios after it")
    print("      n  th  library              time [s]    speed-up  per round")
    rows = []
    for n in lengths:
        children, row = {}, {"n": n}
        for kind in args.libraries:
            if kind.startswith("llama_cpp") and llama is not None:
                row[kind] = {"skipped": llama}
                continue
            for threads in thread_counts:
                children[f"{kind}@{threads}"] = (CHILD, (kind, folder, n, threads, args.repeats,
                                                         os.path.join(folder, f"{kind}@{threads}.npy"), keep, 1),
                                                 threads, {"SHAPE": SHAPE})
        runs = run_in_turns(children, args.repeats)
        for kind in args.libraries:
            if kind in row:
                print(f"{n:>7}  {'':>2}  {kind:<19}  {row[kind]['skipped']}")
                continue
            row[kind] = {}
            base = runs[f"{kind}@{fewest}"]
            for threads in thread_counts:
                r = row[kind][threads] = runs[f"{kind}@{threads}"]
                if "seconds" not in r:
                    fail(f"n={n} {kind} at {threads} threads", f"its process failed: {r.get('error')}")
                    print(f"{n:>7}  {threads:>2}  {kind:<19}  {r.get('error')}")
                    continue
                if "seconds" in base and threads != fewest:
                    r["rounds"] = [a / t for a, t in zip(base["times"], r["times"])]
                    r["speedup"] = round_ratio(base["times"], r["times"])
                    ours, theirs = (np.load(os.path.join(folder, f"{kind}@{t}.npy")) for t in (threads, fewest))
                    r["logits_vs_fewest"] = agree(
                        f"n={n} {kind} last-token logits at {threads} threads vs {fewest}", ours, theirs,
                        rtol=0.0 if kind.startswith("attngeom") else TOLERANCE, show=False)
                speedup = f"{r['speedup']:.2f}x" if "speedup" in r else "1 (anchor)"
                rounds = " ".join(f"{x:.2f}" for x in r.get("rounds", []))
                print(f"{n:>7}  {threads:>2}  {kind:<19}  {r['seconds']:>8.2f}  {speedup:>10}  {rounds}", flush=True)
        print_busy(runs)
        rows.append(row)
    return rows


def main(argv=None):
    ap = parser(__doc__)
    ap.add_argument("--lengths", type=int, nargs="+", default=[512, 2048, 8192])
    ap.add_argument("--long", action="store_true", help="add 32,768 tokens")
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2], dest="thread_list",
                    help="thread counts of every library (default 1 2)")
    ap.add_argument("--libraries", nargs="+", choices=KINDS, help="which runs (default all; with --scaling "
                    "attngeom and attngeom_bf16)")
    ap.add_argument("--no-reference", action="store_true", help="skip the float64 reference forward")
    ap.add_argument("--release-weights", action="store_true",
                    help="attngeom's default: release a mapped checkpoint's pages after each layer")
    ap.add_argument("--scaling", action="store_true",
                    help="each library against itself at the fewest of --threads, the thread counts taking turns")
    args = parse(ap, argv)
    if args.libraries is None:
        args.libraries = ["attngeom", "attngeom_bf16"] if args.scaling else list(KINDS)
    if "transformers_eager" in args.libraries and args.scaling:
        ap.error("--scaling: transformers_eager does not take part (its weights alone may not fit twice)")
    if "transformers_sdpa" not in args.libraries and not args.scaling:
        ap.error("--libraries must include transformers_sdpa: it is the anchor every figure is compared with")
    lengths = ([512, 2048] if args.quick else args.lengths) + ([32768] if args.long else [])
    thread_counts = [2] if args.quick else sorted(set(args.thread_list))
    keep = "0" if args.release_weights else "1"
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        writer = subprocess.run([sys.executable, "-c", "SHAPE = " + repr(SHAPE) + "\n" + WRITER, folder],
                                capture_output=True, text=True)
        if writer.returncode:
            sys.stderr.write(writer.stderr)
            raise SystemExit("writing the checkpoint with transformers failed")
        size = sum(os.path.getsize(os.path.join(folder, f)) for f in os.listdir(folder) if f.endswith(".safetensors"))
        llama = llama_cpp_missing()
        for kind in ("llama_cpp_f32", "llama_cpp_bf16"):
            if kind in args.libraries and llama is None:
                made = run_child(GGUF_WRITER, folder, os.path.join(folder, f"{kind}.gguf"), kind.split("_")[-1],
                                 threads=1)
                if "error" in made:
                    fail(f"writing {kind}.gguf", made["error"])
        print(f"Qwen3-0.6B-shaped checkpoint: {size / 1e9:.2f} GB bfloat16; threads {thread_counts} for every "
              f"library; {cpu_name()}; {build_line()}; attngeom keep_weights={keep == '1'}")
        if args.scaling:
            rows = scaling_rows(args, folder, lengths, thread_counts, keep, llama)
            return finish(args.out, "long_context_scaling", shape=SHAPE, checkpoint_bytes=size,
                          meta=machine(threads_all=thread_counts, repeats=args.repeats, keep_weights=keep == "1"),
                          rows=rows)
        print(f"one process per library, length and thread count, all resident, a warm-up forward each, then "
              f"{args.repeats} rounds of one forward each in turn: time = its median, speed = the median of the "
              f"rounds' ratios; speed/sdpa against transformers float32 sdpa, /peers attngeom against transformers "
              "and llama.cpp in its dtype; peak RSS of the process (loading included); activations = peak RSS while the "
              "forwards ran - RSS after loading; error = the last token's logits against attngeom float64, "
              "relative to its largest logit")
        print("      n  th  library              time [s]   speed/sdpa  speed/peers    RSS [GB]  activ. [GB]  error")
        threads_seen = {}
        for n in lengths:
            reference = None
            if not args.no_reference:
                ref = run_child(CHILD, "reference", folder, n, max(thread_counts), 0,
                                os.path.join(folder, "reference.npy"), keep, 0, threads=max(thread_counts),
                                SHAPE=SHAPE)
                if "error" in ref:
                    fail(f"n={n} reference", f"its process failed: {ref['error']}")
                else:
                    reference = np.load(os.path.join(folder, "reference.npy"))
                print(table_line(n, max(thread_counts), "reference", ref), flush=True)
            for threads in thread_counts:
                row = {"n": n, "threads": threads}
                children = {}
                for kind in KINDS:
                    if kind not in args.libraries:
                        row[kind] = {"skipped": "not asked for (--libraries)"}
                    elif kind.startswith("llama_cpp") and llama is not None:
                        row[kind] = {"skipped": llama}
                    elif kind == "transformers_eager" and threads != max(thread_counts):
                        row[kind] = {"skipped": "at the largest thread count only"}
                    else:
                        children[kind] = (CHILD, (kind, folder, n, threads, args.repeats,
                                                  os.path.join(folder, f"{kind}.npy"), keep, 1),
                                          threads, {"SHAPE": SHAPE})

                def admit(kind):  # asked with the others loaded: their memory counts
                    if kind == "transformers_eager" and eager_bytes(n) > 0.8 * available_bytes():
                        return EAGER_ALONE
                    return None

                row.update(run_in_turns(children, args.repeats, admit=admit))
                if row.get("transformers_eager", {}).get("skipped") == EAGER_ALONE:  # alone, the others gone
                    if eager_bytes(n) > 0.8 * available_bytes():
                        row["transformers_eager"] = {
                            "skipped": f"needs about {eager_bytes(n) / 2 ** 30:.0f} GiB for the weights"}
                    else:
                        code, child_args, _, constants = children["transformers_eager"]
                        row["transformers_eager"] = run_child(code, *child_args[:-1], 0, threads=threads,
                                                              **constants)
                        row["transformers_eager"]["timed_alone"] = True
                for kind in children:
                    threads_seen.setdefault(kind, row[kind].get("threads"))
                base = row["transformers_sdpa"]
                for kind in KINDS:
                    r = row[kind]
                    if "seconds" not in r:
                        continue
                    logits = np.load(os.path.join(folder, f"{kind}.npy"))
                    if reference is not None:
                        r["logits_vs_reference"] = reference_error(logits, reference)
                    if kind != "transformers_sdpa" and "seconds" in base:
                        r["speed_vs_sdpa"] = (base["seconds"] / r["seconds"] if r.get("timed_alone") else
                                              round_ratio(base["times"], r["times"]))
                        r["memory_vs_sdpa"] = r["peak_rss_mb"] / base["peak_rss_mb"]
                    for peer in PEERS.get(kind, ()):
                        if "seconds" in row[peer]:
                            r.setdefault("speed_vs", {})[peer] = round_ratio(row[peer]["times"], r["times"])
                a, sdpa = row["attngeom"], row["transformers_sdpa"]
                if "seconds" in a and "seconds" in sdpa:
                    a["logits_vs_sdpa"] = agree(f"n={n} threads={threads} attngeom last-token logits vs "
                                                "transformers_sdpa", np.load(os.path.join(folder, "attngeom.npy")),
                                                np.load(os.path.join(folder, "transformers_sdpa.npy")),
                                                rtol=TOLERANCE, show=False)
                bf, tf = row["attngeom_bf16"], row["transformers_bf16"]
                if reference is not None and "seconds" in bf and "logits_vs_reference" not in tf:
                    bf["logits_vs_reference_gate"] = {"skipped": "transformers_bf16 did not run: its error is the "
                                                                 "tolerance of this gate"}
                elif reference is not None and "seconds" in bf:
                    theirs = tf["logits_vs_reference"]["max_rel_error"]
                    bf["logits_vs_reference_gate"] = agree(
                        f"n={n} threads={threads} attngeom_bf16 last-token logits vs the float64 reference",
                        np.load(os.path.join(folder, "attngeom_bf16.npy")), reference,
                        rtol=max(BF16_FLOOR, theirs), show=False)
                for kind in KINDS:
                    if "error" in row[kind]:
                        fail(f"n={n} threads={threads} {kind}", f"its process failed: {row[kind]['error']}")
                rows.append(row)
                for kind in KINDS:
                    print(table_line(n, threads, kind, row[kind]), flush=True)
                print_busy({kind: row[kind] for kind in KINDS})
        for kind, counts in threads_seen.items():
            if counts:
                print(f"threads in the {kind} processes: " + ", ".join(f"{k} {v}" for k, v in counts.items()))
    return finish(args.out, "long_context", shape=SHAPE, checkpoint_bytes=size,
                  meta=machine(threads_all=thread_counts, repeats=args.repeats, keep_weights=keep == "1"),
                  threads=threads_seen, rows=rows)


if __name__ == "__main__":
    sys.exit(main())
