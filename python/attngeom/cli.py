"""The ``attngeom`` command line (also ``python -m attngeom``).

    attngeom run <experiment> [--seed N] [--out DIR] [--set key=value ...]
        run a synthetic experiment into DIR/<experiment>_<timestamp>/ (config.json,
        summary.json, summary.md with the paper's values beside ours, every figure as PNG)
    attngeom list                 the experiments and their configuration fields
    attngeom report <run folder>  print a run's summary table
    attngeom demo [--out DIR]     the main experiment (tomography) into DIR
    attngeom config               the build configuration
    attngeom heads <checkpoint> [--n-heads N] [--text FILE | --activations DIR] [--out DIR]
        every attention head's geometry (spectra of B = W_Q W_K^T and W_OV, parameter nulls;
        with activations, radii, tilt coverage and routing ranks) into DIR/heads.json and
        PNGs; <checkpoint> is a .safetensors file, a folder, or a packaged model name
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time


def _parse_sets(config_cls, pairs):
    """key=value overrides, cast to the config field's type."""
    fields = {f.name: f for f in dataclasses.fields(config_cls)}
    out = {}
    for pair in pairs or []:
        if "=" not in pair:
            raise SystemExit(f"--set expects key=value, got {pair!r}")
        key, value = pair.split("=", 1)
        if key not in fields:
            raise SystemExit(f"unknown config field {key!r}; fields: {', '.join(fields)}")
        default = fields[key].default
        kind = type(default) if default is not dataclasses.MISSING else str
        if kind is bool:
            out[key] = value.lower() in ("1", "true", "yes", "on")
        else:
            try:
                out[key] = kind(value)
            except ValueError:
                raise SystemExit(f"--set {key}: cannot read {value!r} as {kind.__name__}") from None
    return out


def run_experiment(name, *, out="runs", seed=None, overrides=None, folder=None, quiet=False) -> str:
    """Run experiment `name` and write its run folder; returns the folder's path."""
    from .experiments import EXPERIMENTS

    if name not in EXPERIMENTS:
        raise SystemExit(f"unknown experiment {name!r}; try: {', '.join(EXPERIMENTS)}")
    config_cls, run = EXPERIMENTS[name]
    values = dict(overrides or {})
    if seed is not None:
        values["seed"] = seed
    config = config_cls(**values)
    t0 = time.perf_counter()
    result = run(config)
    elapsed = time.perf_counter() - t0
    if folder is None:
        folder = os.path.join(out, f"{name}_{time.strftime('%Y%m%d_%H%M%S')}")
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(dataclasses.asdict(config), f, indent=2)
    result.to_json(os.path.join(folder, "summary.json"))
    table = result.table()
    with open(os.path.join(folder, "summary.md"), "w") as f:
        f.write(f"# {name}\n\n{table}\n")
    names = []
    for fname, fig in result.figures().items():
        fig.savefig(os.path.join(folder, fname), dpi=110)
        names.append(fname)
    save_artifacts = getattr(result, "save_artifacts", None)  # e.g. the training driver's checkpoints
    if save_artifacts is not None:
        save_artifacts(folder)
    if not quiet:
        print(f"{name} ({elapsed:.1f} s), seed {config.seed}")
        print(table)
        print(f"wrote {folder}/: config.json, summary.json, summary.md and {len(names)} figures "
              f"({', '.join(names)})")
    return folder


def _run(args) -> int:
    from .experiments import EXPERIMENTS

    overrides = _parse_sets(EXPERIMENTS[args.experiment][0], args.set) if args.experiment in EXPERIMENTS else {}
    run_experiment(args.experiment, out=args.out, seed=args.seed, overrides=overrides)
    return 0


def _demo(args) -> int:
    run_experiment("tomography", folder=args.out, seed=args.seed)
    return 0


def _list(args) -> int:
    from .experiments import EXPERIMENTS

    for name, (config_cls, run) in EXPERIMENTS.items():
        doc = (sys.modules[run.__module__].__doc__ or "").strip().splitlines()[0]
        fields = ", ".join(f"{f.name}={f.default}" for f in dataclasses.fields(config_cls))
        print(f"{name:<16} {doc}\n{'':<16} {fields}")
    return 0


def _report(args) -> int:
    path = os.path.join(args.folder, "summary.md")
    if not os.path.exists(path):
        print(f"no summary.md in {args.folder}", file=sys.stderr)
        return 1
    print(open(path).read())
    return 0


def _config(args) -> int:
    from ._config import show_config

    show_config()
    return 0


def _heads_list(spec):
    """"L.H,L.H" -> [(L, H), ...]"""
    out = []
    for part in spec.split(","):
        try:
            layer, head = part.strip().split(".")
            out.append((int(layer), int(head)))
        except ValueError:
            raise SystemExit(f"--heads expects layer.head pairs like 0.3,5.11, got {spec!r}") from None
    return out


def _heads(args) -> int:
    from .models import head_report, load_activations, load_heads, text_activations

    t0 = time.perf_counter()
    try:
        heads = load_heads(args.checkpoint, n_heads=args.n_heads)
        x, tokens, source = None, None, "weights"
        if args.text is not None:
            try:
                with open(args.text, encoding="utf-8") as f:
                    text = f.read()
            except OSError as exc:
                raise ValueError(f"--text: {exc}") from None
            x, tokens = text_activations(args.checkpoint, text, max_length=args.max_tokens, n_heads=args.n_heads)
            source = f"text ({len(tokens)} tokens, NumPy forward pass)"
        elif args.activations is not None:
            x = load_activations(args.activations, heads.n_layers, heads.d_model)
            source = f"activations ({x.shape[1]} x {x.shape[2]} tokens per layer)"
        report = head_report(heads, x, tokens=tokens, source=source,
                             chosen=None if args.heads is None else _heads_list(args.heads))
    except ValueError as exc:
        print(f"attngeom heads: {exc}", file=sys.stderr)
        return 2
    t1 = time.perf_counter()
    paths = report.save(args.out)
    t2 = time.perf_counter()
    m, mean = report.model, report.summary()["mean"]
    print(f"{m['layout']} model, {m['n_layers']} layers x {m['n_heads']} heads (kv heads {m['n_kv_heads']}), "
          f"d_model {m['d_model']}, d_head {m['d_head']}; source: {source}")
    print(f"mean over heads: bilinear effective rank {mean['bilinear_effective_rank']:.2f} of {m['d_head']}, "
          f"W_OV effective rank {mean['ov_effective_rank']:.2f}, ker B dim {mean['ker_B_dim']:.0f}"
          + (f", routing effective rank {mean['routing_effective_rank_mean']:.2f}, tilt effective dim "
             f"{mean['tilt_effective_dim']:.2f}" if "routing_effective_rank_mean" in mean else ""))
    print(f"analysis {t1 - t0:.2f} s, figures {t2 - t1:.2f} s; wrote {args.out}/: "
          f"{', '.join(os.path.basename(p) for p in paths)}")
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="attngeom", description="The geometry of attention.")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("run", help="run a synthetic experiment into a run folder")
    p.add_argument("experiment")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--out", default="runs", help="parent directory of the run folder (default runs)")
    p.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a config field (repeatable)")
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
    src.add_argument("--text", default=None, metavar="FILE", help="run this text through the NumPy forward pass "
                                                                  "(BERT layout) for the data diagnostics")
    src.add_argument("--activations", default=None, metavar="DIR",
                     help="folder with activations.npy or layer_<i>.npy (the input of each layer's attention)")
    p.add_argument("--heads", default=None, metavar="L.H,...", help="heads to draw in detail (default: extremes)")
    p.add_argument("--max-tokens", type=int, default=None, help="truncate --text to this many tokens")
    p.add_argument("--out", default="heads_report", help="output folder (default heads_report)")
    p.set_defaults(func=_heads)
    p = sub.add_parser("config", help="print the build configuration")
    p.set_defaults(func=_config)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
