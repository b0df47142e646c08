"""Runs every benchmarks/bench_*.py in turn with the given --out directory.

  python benchmarks/run_all.py [--out DIR] [--moonshot] [extra arguments passed to every benchmark, e.g. --quick]

bench_moonshot.py (a 16 GB checkpoint and half an hour or more) runs in full only with
--moonshot; with --quick it runs its quick check like the others.

Each benchmark's output is shown as it runs; its agreement lines (the ``agree ...`` checks
that failed and the ``agreement bench_<name>: ...`` summary, see harness.py) are collected
and printed again in the summary at the end, one block per benchmark. The exit status is
non-zero when any benchmark exits non-zero, prints a failed agreement, or prints no
agreement summary at all (a benchmark without a gate); the others still run.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path


def run(script: Path, out: str, extra: list) -> tuple:
    """Run one benchmark, echoing its output; (exit status, its agreement lines, seconds)."""
    t0 = time.perf_counter()
    lines = []
    with subprocess.Popen([sys.executable, str(script), "--out", out, *extra], stdout=subprocess.PIPE, text=True,
                          bufsize=1) as p:
        for line in p.stdout:
            sys.stdout.write(line)
            sys.stdout.flush()
            if line.startswith("agreement ") or (line.startswith("agree ") and "DISAGREES" in line):
                lines.append(line.rstrip("\n"))
    return p.returncode, lines, time.perf_counter() - t0


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="benchmarks/results", help="directory the benchmarks write their JSON to")
    p.add_argument("--moonshot", action="store_true",
                   help="also run bench_moonshot.py in full (a 16 GB checkpoint and half an hour or more); "
                        "without it the moonshot runs only with --quick")
    args, extra = p.parse_known_args(argv)

    scripts = sorted(Path(__file__).resolve().parent.glob("bench_*.py"))
    if not args.moonshot and "--quick" not in extra:
        scripts = [s for s in scripts if s.name != "bench_moonshot.py"]
    if not scripts:
        print("no benchmarks/bench_*.py found", file=sys.stderr)
        return 1
    results = []
    for script in scripts:
        print(f"== {script.name}", flush=True)
        rc, lines, seconds = run(script, args.out, extra)
        summary = [line for line in lines if line.startswith("agreement ")]
        problems = ([f"exit {rc}"] if rc != 0 else []) + (["no agreement summary"] if not summary else []) + \
            (["agreement FAILED"] if any(": FAILED" in line for line in summary) else [])
        status = "ok" if not problems else "FAILED (" + ", ".join(problems) + ")"
        print(f"== {script.name}: {status} in {seconds:.0f} s\n", flush=True)
        results.append((script.name, status, lines))

    print("== summary: agreement with the anchors")
    for name, status, lines in results:
        print(f"{name}: {status}")
        for line in lines or ["(no agreement line printed)"]:
            print(f"    {line}")
    failed = [name for name, status, _ in results if status != "ok"]
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    print(f"all {len(scripts)} benchmark(s) passed and agree with their anchors")
    return 0


if __name__ == "__main__":
    sys.exit(main())
