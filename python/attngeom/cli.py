"""The ``attngeom`` command line (also ``python -m attngeom``).

    attngeom run <experiment> [--seed N] [--out DIR] [--set key=value ...]
        run one of the papers' experiments (``attngeom run --help`` lists them: synthetic
        ones, and the training and induction runs that train small models) into
        DIR/<experiment>_<timestamp>/ (config.json, summary.json, summary.md with the paper's
        values beside ours, the figures that have data as PNG); Ctrl-C or SIGTERM stops it
        with one line (a training run's line says how to resume it), exit status 130 / 143
    attngeom list                 the experiments and their configuration fields
    attngeom report <run folder>  print a run's summary table
    attngeom demo [--out DIR]     the main experiment (tomography) into DIR
    attngeom config               the build configuration
    attngeom heads <checkpoint> [--n-heads N] [--text FILE ... | --ids FILE ... | --activations DIR] [--effects]
                   [--dtype float64|float32|bfloat16] [--out DIR]
        every attention head's geometry (spectra of B = W_Q W_K^T and W_OV, parameter nulls;
        with activations, radii, tilt coverage, routing ranks and attention entropies) into
        DIR: heads.json (with a glossary of its fields and the tokens), attention.npz,
        PNGs (per-layer distributions, layer x head grids, chosen heads' spectra, heat maps
        with tokens and Laplace-Radon panels), summary.md and a self-contained report.html;
        <checkpoint> is a .safetensors file, a folder, or a packaged model name. --text may
        be repeated, and the data statistics are means over all texts with their spread;
        --effects adds every head's ablation effect on the loss of the first text, the
        singular-direction curves and invariance checks of the heads that matter most;
        --ids FILE reads token ids (whitespace-separated integers) instead of text, for a
        checkpoint without tokenizer files; a text longer than the model's length is
        truncated with a warning naming it (past a rotary model's trained context it is
        analysed whole, with a warning); --dtype is the decoder's forward dtype (bfloat16:
        bfloat16 products with float32 sums)
    attngeom corpus <checkpoint> --corpus FILE [--scheduler ADDRESS | --workers N] [--dtype T] [--out DIR]
        corpus statistics of every head, in-process or on a Dask cluster, into DIR
        (summary.json, heads.csv, layers.png); --state DIR resumes; --write-store STORE runs
        the corpus through the model once into an activation store (Zarr) and computes the
        statistics from it
    attngeom corpus <store> [--scheduler ADDRESS | --workers N] [--out DIR]
        the same statistics from an activation store, without the model

Both commands read their text files by one rule (``models.split_texts``): one text per
paragraph, paragraphs separated by blank lines, the lines of a paragraph joined, so wrapped
prose stays whole. ``--split line`` reads one text per non-empty line instead (files with one
document a line; the rule ``corpus`` used before). A file of several lines without a blank
line is one text by the paragraph rule; the command says so on stderr and names --split line.

Every misuse (a bad --set value, an output path that cannot be written, an unreadable
checkpoint) is one line on stderr and exit status 2, found before any computation starts.
Warnings are one line each on stderr ("attngeom heads: warning: ..."), without a source line.
Output folders are written whole or not at all (:mod:`attngeom.experiments.folders`).
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import signal
import sys
import time
import warnings

from .errors import ContextWarning
from .experiments import EXPERIMENTS, experiment, run_experiment, run_summary, write_folder


_TRUE, _FALSE = ("true", "1", "yes"), ("false", "0", "no")


def _parse_sets(config_cls, pairs):
    """key=value overrides, cast to the config field's type; ValueError naming the field."""
    fields = {f.name: f for f in dataclasses.fields(config_cls)}
    out = {}
    for pair in pairs or []:
        if "=" not in pair:
            raise ValueError(f"--set expects key=value, got {pair!r}")
        key, value = pair.split("=", 1)
        if key not in fields:
            raise ValueError(f"unknown config field {key!r}; fields: {', '.join(fields)}")
        default = fields[key].default
        kind = type(default) if default is not dataclasses.MISSING else str
        if kind is bool:
            word = value.strip().lower()
            if word not in _TRUE + _FALSE:
                raise ValueError(f"--set {key}: {value!r} is not a boolean (true/false, 1/0, yes/no)")
            out[key] = word in _TRUE
        else:
            try:
                out[key] = kind(value)
            except ValueError:
                raise ValueError(f"--set {key}: cannot read {value!r} as {kind.__name__}") from None
    return out


def _run(args) -> int:
    overrides = _parse_sets(experiment(args.experiment)[0], args.set)
    run_experiment(args.experiment, out=args.out, seed=args.seed, overrides=overrides, resume=args.resume)
    return 0


def _demo(args) -> int:
    run_experiment("tomography", folder=args.out, seed=args.seed)
    return 0


def _experiment_doc(name) -> str:
    """The first line of experiment `name`'s module docstring: what it runs."""
    module = ".".join(EXPERIMENTS[name][1].__module__.split(".")[:3])  # attngeom.experiments.<name>: module or package
    return (sys.modules[module].__doc__ or "").strip().splitlines()[0]


def _list(args) -> int:
    for name, (config_cls, run) in EXPERIMENTS.items():
        fields = ", ".join(f"{f.name}={f.default}" for f in dataclasses.fields(config_cls))
        print(f"{name:<16} {_experiment_doc(name)}\n{'':<16} {fields}")
    return 0


def _report(args) -> int:
    print(run_summary(args.folder))
    return 0


def _config(args) -> int:
    from ._config import show_config

    show_config()
    return 0


def version_line() -> str:
    """``attngeom --version``: the version, the instruction-set level in use (of those compiled),
    the core's OpenMP threads and NumPy's BLAS."""
    import io

    from ._config import show_config

    cfg = show_config(file=io.StringIO())
    openmp = f"{cfg['threads']} OpenMP threads" if cfg["openmp"] else "no OpenMP (1 thread)"
    blas = f"BLAS {cfg['blas']} ({cfg['blas_threads']} threads)" if cfg["blas"] else "BLAS unknown"
    return f"attngeom {cfg['version']}: level {cfg['isa']} (compiled: {cfg['isa_compiled']}), {openmp}, {blas}"


class _Version(argparse.Action):
    """--version, computed when asked (the parser is built without loading the core)."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, help=None):
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        print(version_line())
        parser.exit()


def _heads_list(spec):
    """"L.H,L.H" -> [(L, H), ...]"""
    out = []
    for part in spec.split(","):
        try:
            layer, head = part.strip().split(".")
            out.append((int(layer), int(head)))
        except ValueError:
            raise ValueError(f"--heads expects layer.head pairs like 0.3,5.11, got {spec!r}") from None
    return out


def _read_texts(paths, split, option):
    """The texts of the files given to ``option`` (--text or --corpus), split by ``split``
    ("paragraph" or "line", models.split_texts)."""
    from .models import split_texts

    texts = []
    for path in paths or []:
        try:
            with open(path, encoding="utf-8") as f:
                content = f.read()
        except (OSError, UnicodeDecodeError) as exc:
            raise ValueError(f"{option}: {exc}") from None
        found = split_texts(content, by=split)
        if not found:
            raise ValueError(f"{option}: {path!r} holds no text (no non-empty line)")
        lines = sum(1 for line in content.splitlines() if line.strip())
        if split == "paragraph" and len(found) == 1 and lines > 1:
            print(f"note: {option} {path!r} has no blank line, so its {lines} lines are one text "
                  f"(--split line reads one text per line)", file=sys.stderr)
        texts += found
    return texts


def _read_ids(paths):
    """The token-id sequences of the files given to --ids: whitespace-separated integers, one
    sequence a file."""
    out = []
    for path in paths or []:
        try:
            with open(path, encoding="utf-8") as f:
                words = f.read().split()
        except (OSError, UnicodeDecodeError) as exc:
            raise ValueError(f"--ids: {exc}") from None
        if not words:
            raise ValueError(f"--ids: {path!r} holds no token ids")
        try:
            out.append([int(w) for w in words])
        except ValueError:
            bad = next(w for w in words if not w.lstrip("+-").isdigit())
            raise ValueError(f"--ids: {path!r} must hold whitespace-separated integer token ids, found {bad!r}") from None
    return out


def _id_activations(ids, *, model=None, encoder=None, dtype="float64"):
    """(attention inputs (n_layers, 1, n, d_model), token strings) of one sequence of token ids:
    the ids decoded by the checkpoint's tokenizer where it has one, else "#<id>". `dtype` is
    the decoder's forward dtype (the encoder runs in float64)."""
    import numpy as np

    ids = np.asarray(ids, dtype=np.int64)
    if encoder is not None and dtype != "float64":
        raise ValueError(f"--dtype {dtype}: BERT's encoder runs in float64 only (dtype applies to decoders)")
    if encoder is not None:
        x = encoder.forward(ids).hidden_states[:-1, None]
    else:
        x = model.forward(ids, dtype=dtype, keep=("attn_in",)).attn_in[:, None]
    try:
        tokens = (model.to_str_tokens(ids) if model is not None else None)
    except (ValueError, OSError, ImportError):
        tokens = None
    return x, list(tokens) if tokens is not None else [f"#{int(i)}" for i in ids]


#: The forward dtypes the heads and corpus commands offer (Model.forward's).
DTYPES = ("float64", "float32", "bfloat16")

#: Tokens of the first text the heads report's --effects runs on (each head costs a pass).
EFFECT_TOKENS = 256


def _report_scores(model):
    """Induction, previous-token and duplicate-token scores for the heads report: a causal
    decoder's, on the default probe of ``induction_scores``; None otherwise."""
    from .models import induction_scores

    if model is None or model.arch.bidirectional:
        return None
    try:
        return induction_scores(model)
    except ValueError:  # a vocabulary or context too small for the probe, multi-head latent attention
        return None


def _heads(args) -> int:
    from .models import (BertEncoder, causal_effects, head_report, head_view, load_activations, load_heads,
                         load_model, text_activations)
    from .models.analysis.report import report_attribution

    chosen = None if args.heads is None else _heads_list(args.heads)
    if args.map_text < 0:
        raise ValueError(f"--map-text must be >= 0, got {args.map_text}")
    if args.max_tokens is not None and args.max_tokens < 2:
        raise ValueError(f"--max-tokens must be >= 2 (a query needs a key besides itself), got {args.max_tokens}")
    texts = _read_texts(args.text, args.split, "--text")
    id_lists = _read_ids(args.ids)
    if args.map_text and args.map_text >= max(len(texts), len(id_lists)):
        raise ValueError(f"--map-text {args.map_text}: there are {max(len(texts), len(id_lists))} texts "
                         f"(0..{max(len(texts), len(id_lists)) - 1})")
    if args.max_tokens is not None:
        id_lists = [ids[:args.max_tokens] for ids in id_lists]
    if args.dtype != "float64" and not (texts or id_lists):
        raise ValueError(f"--dtype {args.dtype} is the forward pass's: give --text FILE or --ids FILE")
    pass_dtype = "" if args.dtype == "float64" else f", {args.dtype}"
    effects_model = None
    if args.effects:  # refused before any computation: a text and a model with an lm_head are needed
        if not texts and not id_lists:
            raise ValueError("--effects measures the model's loss on a text: give --text FILE (or --ids FILE)")
        effects_model = load_model(args.checkpoint)
        if not effects_model.has_unembedding:
            raise ValueError(f"--effects measures the next-token loss, and this {effects_model.arch.model_type} "
                             f"checkpoint has no lm_head")
    done = {}

    def write(staging):
        t0 = time.perf_counter()
        heads = load_heads(args.checkpoint, n_heads=args.n_heads)
        x, tokens, source = None, None, "weights"
        if id_lists:
            reuse = ({"encoder": BertEncoder.from_checkpoint(args.checkpoint, n_heads=args.n_heads)}
                     if heads.layout == "bert" else {"model": effects_model or load_model(args.checkpoint)})
            x, tokens = map(list, zip(*(_id_activations(ids, dtype=args.dtype, **reuse) for ids in id_lists)))
            n = sum(len(t) for t in tokens)
            source = (f"token ids ({n} tokens, NumPy forward pass{pass_dtype})" if len(id_lists) == 1 else
                      f"{len(id_lists)} sequences of token ids ({n} tokens, NumPy forward pass{pass_dtype})")
        elif texts:
            reuse = ({"encoder": BertEncoder.from_checkpoint(args.checkpoint, n_heads=args.n_heads)}
                     if heads.layout == "bert" else {"model": effects_model or load_model(args.checkpoint)})
            x, tokens = [], []
            for text in texts:
                xi, ti = text_activations(args.checkpoint, text, max_length=args.max_tokens, n_heads=args.n_heads,
                                          dtype=args.dtype, **reuse)
                x.append(xi)
                tokens.append(ti)
            n = sum(len(t) for t in tokens)
            source = (f"text ({n} tokens, NumPy forward pass{pass_dtype})" if len(texts) == 1 else
                      f"{len(texts)} texts ({n} tokens, {min(map(len, tokens))}-{max(map(len, tokens))} per text, "
                      f"NumPy forward pass{pass_dtype})")
        elif args.activations is not None:
            x = load_activations(args.activations, heads.n_layers, heads.d_model)
            source = f"activations ({x.shape[1]} x {x.shape[2]} tokens per layer)"
        # each text's length was said above, once: the later passes over the same texts say no more
        warnings.filterwarnings("ignore", category=ContextWarning)
        effects = None
        if effects_model is not None:
            ids = (id_lists[0][:EFFECT_TOKENS] if id_lists else effects_model.tokenize(
                texts[0], max_length=min(args.max_tokens or EFFECT_TOKENS, EFFECT_TOKENS))[0])
            effects = causal_effects(effects_model, ids, top=3)
        decoder = reuse.get("model") if (texts or id_lists) else None  # the leads need a causal decoder's pass
        report = head_report(heads, x, tokens=tokens, source=source, chosen=chosen, effects=effects,
                             scores=_report_scores(decoder), map_text=args.map_text)
        if chosen is not None:
            report.criterion = "--detail-heads"
        k = args.map_text
        viewer = decoder
        if viewer is None and heads.layout == "bert" and (texts or id_lists):  # the encoder's view: its Model
            try:
                viewer = load_model(args.checkpoint)
            except (ValueError, OSError):  # a checkpoint only BertEncoder reads (no model_type): no view
                viewer = None
        if viewer is not None:
            report.view = head_view(viewer, id_lists[k] if id_lists else texts[k], max_length=len(tokens[k]))
        if decoder is not None:
            ids_k = id_lists[k] if id_lists else decoder.tokenize(texts[k], max_length=len(tokens[k]))[0]
            report.attribution = report_attribution(decoder, ids_k, tokens[k])
        t1 = time.perf_counter()
        paths = report.save(staging)
        done.update(report=report, source=source, names=[os.path.basename(p) for p in paths],
                    analysis=t1 - t0, figures=time.perf_counter() - t1)

    write_folder(args.out, "heads.json", write)
    report = done["report"]
    m, mean = report.model, report.summary()["mean"]
    print(f"{m.get('model_type') or m['layout']} model, {m['n_layers']} layers x {m['n_heads']} heads "
          f"(kv heads {m['n_kv_heads']}), "
          f"d_model {m['d_model']}, d_head {m['d_head']}; source: {done['source']}")
    print(f"mean over heads: bilinear effective rank {mean['bilinear_effective_rank']:.2f} of {m['d_head']}, "
          f"W_OV effective rank {mean['ov_effective_rank']:.2f}, ker B dim {mean['ker_B_dim']:.0f}"
          + (f", routing effective rank {mean['routing_effective_rank_mean']:.2f}, tilt effective dim "
             f"{mean['tilt_effective_dim']:.2f}" if "routing_effective_rank_mean" in mean else ""))
    print(layer_table(report.layer_means()))
    if report.effects is not None:
        ranked = sorted(report.effects.heads.table(), key=lambda r: r["rank"])[:5]
        print(f"causal effects ({report.effects.n_tokens} tokens, baseline loss {report.effects.heads.baseline:.4g}): "
              + ", ".join(f"L{r['layer']}H{r['head']} {r['effect']:+.3g}" for r in ranked))
    print(f"analysis {done['analysis']:.2f} s, figures {done['figures']:.2f} s; wrote {args.out}/: "
          f"{', '.join(done['names'])}")
    return 0


def _dask_client(args):
    """(client, cluster) for --scheduler / --workers, or (None, None) in-process."""
    if args.scheduler is None and args.workers is None:
        return None, None
    try:
        from distributed import Client, LocalCluster
    except ImportError:
        raise ValueError("--scheduler / --workers need dask[distributed] (pip install 'attngeom[corpus]')") from None
    if args.scheduler is not None:
        try:
            return Client(args.scheduler, timeout="10s"), None
        except (OSError, TimeoutError) as exc:
            raise ValueError(f"--scheduler {args.scheduler!r}: cannot connect ({exc})") from None
    import dask

    # the workers' statistical profiler keeps ~1000 s of call stacks, which grows a worker's memory with the run
    with dask.config.set({"distributed.worker.profile.enabled": False}):
        cluster = LocalCluster(n_workers=args.workers, processes=True, threads_per_worker=1, dashboard_address=None)
    return Client(cluster), cluster


def _corpus_source(args):
    """(texts, from_store) after checking the options that depend on whether the positional
    argument is an activation store."""
    from .corpus.store import is_store

    if is_store(args.checkpoint):
        given = [name for name, v in (("--corpus", args.corpus), ("--write-store", args.write_store),
                                      ("--state", args.state), ("--max-tokens", args.max_tokens),
                                      ("--dtype", args.dtype)) if v is not None]
        if given:
            raise ValueError(f"{', '.join(given)} do not apply: {args.checkpoint!r} is an activation store (its "
                             "texts and activations are in it)")
        return None, True
    if args.corpus is None:
        raise ValueError("--corpus FILE is required unless the first argument is an activation store")
    if args.write_store is not None:
        if args.dtype == "bfloat16":
            raise ValueError("--dtype bfloat16 does not apply with --write-store (a store holds float64 or float32 "
                             "activations); use float32, or no store")
        if args.state is not None:
            raise ValueError("--state does not apply with --write-store (the statistics are read from the store)")
        if os.path.lexists(args.write_store):
            raise ValueError(f"--write-store {args.write_store!r} exists; choose a new folder")
    return _read_texts([args.corpus], args.split, "--corpus"), False


def _corpus(args) -> int:
    from .corpus import corpus_statistics, write_activations

    texts, from_store = _corpus_source(args)
    for option in ("workers", "batch_tokens", "max_tokens"):  # integers (argparse's type=int); counts >= 1
        if getattr(args, option) is not None and getattr(args, option) < 1:
            raise ValueError(f"--{option.replace('_', '-')} must be >= 1, got {getattr(args, option)}")
    batch_tokens = args.batch_tokens if args.batch_tokens is not None or from_store else 1024
    done = {}

    def write(staging):
        client, cluster = _dask_client(args)
        try:
            t0 = time.perf_counter()
            if from_store:
                res = corpus_statistics(args.checkpoint, batch_tokens=batch_tokens, client=client)
            elif args.write_store is not None:
                store = write_activations(args.checkpoint, texts, args.write_store, batch_tokens=batch_tokens,
                                          max_length=args.max_tokens, dtype=args.dtype or "float64")
                done["stored"] = time.perf_counter() - t0
                res = corpus_statistics(store, client=client)
            else:
                res = corpus_statistics(args.checkpoint, texts, batch_tokens=batch_tokens, client=client,
                                        state_dir=args.state, max_length=args.max_tokens,
                                        dtype=args.dtype or "float64")
            done.update(res=res, elapsed=time.perf_counter() - t0)
        finally:
            if client is not None:
                client.close()
            if cluster is not None:
                cluster.close()
        res.write_table(os.path.join(staging, "heads.csv"))
        import matplotlib.pyplot as plt

        for name, fig in (("layers.png", res.plot_layers()), ("profile.png", res.plot_profile())):
            if fig is not None:
                fig.savefig(os.path.join(staging, name), dpi=110)
                plt.close(fig)
        res.to_json(os.path.join(staging, "summary.json"))  # last: the folder's marker

    write_folder(args.out, "summary.json", write)
    res, m = done["res"], done["res"].model
    where = (f"scheduler {args.scheduler}" if args.scheduler else f"{args.workers} local workers" if args.workers
             else "in-process")
    source = " from the activation store" if from_store or args.write_store is not None else ""
    print(f"{m['family']} model, {m['n_layers']} layers x {m['n_heads']} heads; {res.n_texts} texts, {res.n_tokens} "
          f"tokens in {res.n_partitions} partitions{source} ({where}), {done['elapsed']:.1f} s "
          f"({res.n_tokens / max(done['elapsed'], 1e-9):.0f} tokens/s)")
    if "stored" in done:
        print(f"wrote the activation store {args.write_store} in {done['stored']:.1f} s")
    print(f"wrote {args.out}/: summary.json, heads.csv, layers.png"
          + (", profile.png" if "profile" in res.statistics else ""))
    return 0


# --split of the commands that read text files: one rule for both (module docstring).
_SPLIT = dict(choices=("paragraph", "line"), default="paragraph",
              help="how a file is cut into texts: 'paragraph' (default; blank lines separate texts, the lines "
                   "of a paragraph are joined) or 'line' (one text per non-empty line)")


def layer_table(layers: list, width: int = 12) -> str:
    """Per-layer means as text, one quantity per row with its full name and the layers as
    columns (at most `width` layers to a block), so no name is cut to a column's width."""
    keys = [k for k in layers[0] if k != "layer"]
    name = max(len(k) for k in keys)
    lines = ["per layer, mean over heads:"]
    for start in range(0, len(layers), width):
        block = layers[start:start + width]
        lines.append(f"  {'layer':<{name}} " + " ".join(f"{r['layer']:>9d}" for r in block))
        lines += [f"  {k:<{name}} " + " ".join(f"{r[k]:9.3g}" for r in block) for k in keys]
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    """The command line's parser (``attngeom run | list | report | demo | heads | corpus | config``)."""
    parser = argparse.ArgumentParser(prog="attngeom", description="The geometry of attention.")
    parser.add_argument("--version", action=_Version,
                        help="print the version, the instruction-set level in use, the OpenMP threads and the BLAS")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("run", help="run one of the experiments (attngeom run --help lists them) into a run folder",
                       description="Run an experiment into a run folder: config.json, summary.json, summary.md\n"
                                   "with the paper's values beside ours, the figures that have data as PNG.\n"
                                   "Ctrl-C or SIGTERM stops it with one line; a training or induction run's\n"
                                   "line says how to resume it.",
                       epilog="experiments (attngeom list shows their configuration fields):\n"
                              + "\n".join(f"  {name:<16} {_experiment_doc(name)}" for name in EXPERIMENTS),
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("experiment", help="the experiment's name (listed below)")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--out", default="runs", help="parent directory of the run folder (default runs)")
    p.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a config field (repeatable)")
    p.add_argument("--resume", default=None, metavar="FOLDER",
                   help="continue an interrupted training or induction run from its hidden '.<run>.<random>.partial' "
                        "folder (its saved config; the result equals an uninterrupted run's)")
    p.set_defaults(func=_run)
    p = sub.add_parser("list", help="list the experiments")
    p.set_defaults(func=_list)
    p = sub.add_parser("report", help="print a run folder's summary table")
    p.add_argument("folder")
    p.set_defaults(func=_report)
    p = sub.add_parser("demo", help="run the tomography experiment (Laplace-Radon Table 1) into a folder")
    p.add_argument("--out", default="runs/demo", help="run folder (default runs/demo)")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=_demo)
    p = sub.add_parser("heads", help="report every attention head's geometry of a checkpoint")
    p.add_argument("checkpoint", help="a .safetensors file, a folder with one (and config.json), or a packaged "
                                      "model name such as all-MiniLM-L6-v2")
    p.add_argument("--n-heads", type=int, default=None, help="number of heads (needed without config.json)")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--text", action="append", default=None, metavar="FILE",
                     help="run the texts of FILE through the NumPy forward pass for the data diagnostics (one "
                          "text per paragraph, see --split); repeatable; statistics are averaged over all texts, "
                          "with their spread")
    src.add_argument("--ids", action="append", default=None, metavar="FILE",
                     help="run a sequence of token ids (whitespace-separated integers in FILE) through the NumPy "
                          "forward pass instead of a text, for a checkpoint without tokenizer files; repeatable")
    src.add_argument("--activations", default=None, metavar="DIR",
                     help="folder with activations.npy or layer_<i>.npy (the input of each layer's attention)")
    p.add_argument("--split", **_SPLIT)
    p.add_argument("--detail-heads", "--heads", dest="heads", default=None, metavar="L.H,...",
                   help="heads to draw in detail (default: the largest ablation effects with --effects, else the "
                        "best induction, previous-token and duplicate-token heads of a decoder given a text, else "
                        "the spectral extremes)")
    p.add_argument("--map-text", type=int, default=0, metavar="K",
                   help="the text (from 0) whose attention maps, profile and head view are drawn (default 0)")
    p.add_argument("--max-tokens", type=int, default=None,
                   help="truncate each text to this many tokens (default: the model's length; a longer text is "
                        "truncated to it with a warning)")
    p.add_argument("--effects", action="store_true",
                   help=f"add causal effects on the first text (at most {EFFECT_TOKENS} tokens): every head's "
                        "mean-ablation effect on the loss, the singular-direction curves and invariance checks of "
                        "the three heads that matter most, a spectrum-vs-effect figure (models with an lm_head)")
    p.add_argument("--dtype", choices=DTYPES, default="float64",
                   help="the forward pass's dtype for --text / --ids (default float64; bfloat16: bfloat16 "
                        "products with float32 sums, as Model.forward(dtype='bfloat16'); BERT runs in float64 only)")
    p.add_argument("--out", default="heads_report", help="output folder (default heads_report)")
    p.set_defaults(func=_heads)
    p = sub.add_parser("corpus", help="corpus statistics of every head, in-process or on a Dask cluster")
    p.add_argument("checkpoint", help="a checkpoint folder (config.json, *.safetensors, tokenizer.json) or a name; "
                                      "or an activation store (then without --corpus)")
    p.add_argument("--corpus", default=None, metavar="FILE", help="UTF-8 text file (one text per paragraph, see "
                                                                 "--split)")
    p.add_argument("--split", **_SPLIT)
    where = p.add_mutually_exclusive_group()
    where.add_argument("--scheduler", default=None, metavar="ADDRESS", help="a Dask scheduler (tcp://host:port)")
    where.add_argument("--workers", type=int, default=None, metavar="N", help="start a local cluster of N processes")
    p.add_argument("--batch-tokens", type=int, default=None,
                   help="padded tokens per forward pass (default 1024; for a store, the store's)")
    p.add_argument("--max-tokens", type=int, default=None, help="truncate every text to this many tokens")
    p.add_argument("--state", default=None, metavar="DIR", help="save per-partition states here (resume a run)")
    p.add_argument("--write-store", default=None, metavar="STORE",
                   help="run the corpus through the model once into this activation store (Zarr) and compute the "
                        "statistics from it; pass STORE as the first argument of later runs")
    p.add_argument("--dtype", choices=DTYPES, default=None,
                   help="the forward pass's dtype (default float64; statistics accumulate in float64; a store "
                        "written with --write-store holds float64 or float32)")
    p.add_argument("--out", default="corpus_report", help="output folder (default corpus_report)")
    p.set_defaults(func=_corpus)
    p = sub.add_parser("config", help="print the build configuration")
    p.set_defaults(func=_config)
    return parser


class _Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the command is, so that it stops as on Ctrl-C: output folders
    cleaned up, a training run's staging folder kept with its resume line."""


def _terminate(signum, frame):
    raise _Terminated()


#: At most this many ContextWarnings are printed by a command (a corpus of long texts warns for each batch).
CONTEXT_WARNINGS = 5


def _warning_line(command):
    """warnings.showwarning for the command line: one line on stderr, without the source line;
    after CONTEXT_WARNINGS warnings about the model's context, one line saying the rest are not shown."""
    seen = [0]

    def show(message, category, filename, lineno, file=None, line=None):
        if issubclass(category, ContextWarning):
            seen[0] += 1
            if seen[0] > CONTEXT_WARNINGS:
                if seen[0] == CONTEXT_WARNINGS + 1:
                    print(f"attngeom {command}: warning: further warnings about the model's context are not shown",
                          file=sys.stderr)
                return
        print(f"attngeom {command}: warning: {message}", file=sys.stderr)
    return show


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        previous = signal.signal(signal.SIGTERM, _terminate)
    except ValueError:  # not the main thread: SIGTERM keeps its handler
        previous = None
    try:
        with warnings.catch_warnings():
            warnings.showwarning = _warning_line(args.command)
            return args.func(args)
    except KeyboardInterrupt as exc:  # Ctrl-C or SIGTERM: one line (a training run printed its resume line)
        terminated = isinstance(exc, _Terminated)
        if not getattr(exc, "reported", False):
            print(f"attngeom {args.command}: {'terminated (SIGTERM)' if terminated else 'interrupted'}",
                  file=sys.stderr)
        return 143 if terminated else 130
    except (ValueError, OSError, ImportError) as exc:  # misuse, bad input or output, a missing extra: one line
        print(f"attngeom {args.command}: {exc}", file=sys.stderr)
        return 2
    except MemoryError as exc:  # sizes beyond the machine (NumPy names the allocation)
        print(f"attngeom {args.command}: out of memory: {exc or 'an allocation failed'}; choose smaller sizes "
              f"(--set)", file=sys.stderr)
        return 2
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
