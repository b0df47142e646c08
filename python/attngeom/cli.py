"""The ``attngeom`` command line (also ``python -m attngeom``).

    attngeom demo [--out DIR] [--seed N]   run the Laplace-Radon identity demo into DIR
    attngeom config                         print the build configuration
"""
from __future__ import annotations

import argparse
import os
import sys


def _demo(args) -> int:
    from .experiments.identity import IdentityConfig, run_identity

    res = run_identity(IdentityConfig(seed=args.seed))
    os.makedirs(args.out, exist_ok=True)
    res.to_json(os.path.join(args.out, "summary.json"))
    figures = {"identity_errors.png": res.plot_errors, "radii.png": res.plot_radii,
               "transform.png": res.plot_transform}
    for name, plot in figures.items():
        fig = plot()
        fig.savefig(os.path.join(args.out, name), dpi=120)
    s = res.summary()
    print(f"Laplace-Radon identity on {s['n_heads']} random heads "
          f"(d_model {res.config.d_model}, d_k {res.config.d_k}, {res.config.n_examples} x {res.config.n_tokens} tokens)")
    print(f"  max relative error  N/Z vs softmax, float64: {s['laplace_radon_rel_error_max']:.2e}")
    print(f"  max relative error  N/Z vs softmax, float32: {s['laplace_radon_rel_error_float32']:.2e}")
    print(f"  Laplace radius tau: mean {s['tau_mean']:.4f}, std {s['tau_std']:.4f}")
    print(f"wrote {args.out}/summary.json and {', '.join(figures)}")
    return 0


def _config(args) -> int:
    from ._config import show_config

    show_config()
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="attngeom", description="The geometry of attention.")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("demo", help="run the Laplace-Radon identity demo and write a run folder")
    p.add_argument("--out", default="runs/demo", help="run folder (default runs/demo)")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=_demo)
    p = sub.add_parser("config", help="print the build configuration")
    p.set_defaults(func=_config)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
