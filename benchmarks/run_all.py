"""Runs every benchmarks/bench_*.py in turn with the given --out directory.

  python benchmarks/run_all.py [--out DIR] [extra arguments passed to every benchmark]

The exit status is non-zero when any benchmark fails; the others still run.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="benchmarks/results", help="directory the benchmarks write their JSON to")
    args, extra = p.parse_known_args(argv)

    scripts = sorted(Path(__file__).resolve().parent.glob("bench_*.py"))
    if not scripts:
        print("no benchmarks/bench_*.py found", file=sys.stderr)
        return 1
    failed = []
    for script in scripts:
        print(f"== {script.name}", flush=True)
        t0 = time.perf_counter()
        rc = subprocess.call([sys.executable, str(script), "--out", args.out, *extra])
        status = "ok" if rc == 0 else f"FAILED (exit {rc})"
        print(f"== {script.name}: {status} in {time.perf_counter() - t0:.0f} s\n", flush=True)
        if rc != 0:
            failed.append(script.name)
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    print(f"all {len(scripts)} benchmark(s) passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
