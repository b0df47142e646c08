"""What the benchmarks share: their command line, the thread counts, the agreement gate, the
memory figures and the JSON they write.

Each ``bench_<concept>.py`` runs as a script (``python benchmarks/bench_lightning.py``), which
puts this folder on ``sys.path``; ``from harness import ...`` then finds this module.

The agreement gate
------------------
A benchmark never times wrong code: every output it times is compared with its anchor's
(the library or reference it is timed against, measured in the same run) by :func:`agree`,
which records the case's largest absolute and relative error against a tolerance chosen a
clear factor above the agreement measured on this build (each script says why its
tolerances are what they are). :func:`finish` writes the JSON (the checks under
``"agreement"``, the thread counts under ``"threads"``), prints the summary line

    agreement bench_<name>: ok, <k> checks within tolerance; worst <case>: ...
    agreement bench_<name>: FAILED, <j> of <k> checks beyond tolerance: <cases>

(run_all.py collects it) and returns the exit status: 1 when any check failed, when a
check could not be made (:func:`fail`: an output missing because a process crashed) or when
none was recorded.

Planting a disagreement
-----------------------
``ATTNGEOM_BENCH_PLANT=<name>`` (a script's name, with or without ``bench_``; several
separated by commas; or ``all``) makes :func:`agree` add twice its tolerance to attngeom's
output in that benchmark before every comparison, so every check fails and the script exits
1; this shows the path from a disagreement to the exit status (and to run_all.py's summary)
works. For example::

    ATTNGEOM_BENCH_PLANT=lightning python benchmarks/bench_lightning.py --quick   # exits 1

It is off unless the variable is set; a planted run says so in every check line and in the
JSON.

Timing, threads and memory
--------------------------
Times are medians over ``--repeats`` calls (default 3) after one untimed warm-up call
(``attngeom.experiments.timing.median_time`` / ``timed(..., warm_up=True)``, or
``bench_attention.time_interleaved`` for contenders timed round by round), and are reported
as ratios to the anchor measured in the same run, never asserted on; a benchmark that
cannot repeat a call says why in its output. Libraries that run in processes of their own
take turns (:func:`run_in_turns`): all resident at once, one forward each per round, and
their ratios are the median over rounds of one round's ratio (:func:`round_ratio`), so a
slow spell of a shared machine, which slows one round's forwards alike, cancels.
``--quick`` runs every benchmark at small sizes: a check of the gates, not a measurement. Every benchmark prints the thread counts in
force (:func:`print_threads`: attngeom's, NumPy BLAS's, torch's). The memory benchmarks run
each library in a fresh process (:func:`run_child`, :func:`measure_forward`) and report
two figures (:func:`memory_figures`): the process's peak resident set, and the activation
memory, the peak while the forwards ran minus the resident set after loading.
"""
from __future__ import annotations

import argparse
import io
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Optional

import numpy as np

import attngeom as ag

PLANT_VARIABLE = "ATTNGEOM_BENCH_PLANT"

_checks: list = []


def bench_name() -> str:
    """The running benchmark's name: its script's file name without ``.py``."""
    return Path(sys.argv[0]).stem


def parser(doc: str, *, repeats: Optional[int] = 3, threads: bool = False,
           default_threads: Optional[int] = None) -> argparse.ArgumentParser:
    """The common options: ``--out`` (the results directory), ``--quick`` (small sizes),
    ``--repeats`` (timed calls per case after a warm-up, default `repeats`; None leaves the
    option out) and, with `threads`, ``--threads`` (attngeom's thread count, and the anchor's,
    default `default_threads` or attngeom's own; applied by :func:`parse`)."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="benchmarks/results", help="directory the JSON file is written to")
    p.add_argument("--quick", action="store_true", help="small sizes: a check of the gates, not a measurement")
    if repeats is not None:
        p.add_argument("--repeats", type=int, default=repeats,
                       help=f"timed calls per case after one warm-up call (default {repeats})")
    if threads:
        p.add_argument("--threads", type=int, default=default_threads,
                       help=f"threads of attngeom and of the anchor (default {default_threads or 'attngeom`s own'})")
    return p


def parse(p: argparse.ArgumentParser, argv=None) -> argparse.Namespace:
    """The parsed arguments; a ``--threads`` count given is applied with ag.set_num_threads
    (attngeom's kernels and NumPy's BLAS; the script sets its anchor's, e.g. torch's)."""
    args = p.parse_args(argv)
    if getattr(args, "threads", None) is not None:
        ag.set_num_threads(args.threads)
    if getattr(args, "repeats", 3) < 3:
        print(f"note: --repeats {args.repeats}: medians of fewer than 3 timed calls")
    return args


def thread_counts(**anchors) -> dict:
    """The thread counts in force: attngeom's kernels, NumPy's BLAS (threadpoolctl's count),
    torch's intra-op threads when torch is imported, and `anchors` (name -> count)."""
    counts = {"attngeom": ag.get_num_threads(), "numpy_blas": ag.show_config(file=io.StringIO())["blas_threads"]}
    if "torch" in sys.modules:
        counts["torch"] = sys.modules["torch"].get_num_threads()
    counts.update(anchors)
    return counts


def cpu_name() -> str:
    """The processor as /proc/cpuinfo names it: ``<model name> (cpu family F model M)``, the
    family and model that tell, say, AMD Zen 4 (family 25, model 17) from Zen 5 (family 26);
    ``platform.processor()`` where there is no /proc/cpuinfo."""
    fields = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in ("model name", "cpu family", "model") and key.strip() not in fields:
                    fields[key.strip()] = value.strip()
                if len(fields) == 3:
                    break
    except OSError:
        return platform.processor() or "unknown processor"
    return f"{fields.get('model name')} (cpu family {fields.get('cpu family')} model {fields.get('model')})"


def build_line() -> str:
    """attngeom's instruction-set level in use and its bfloat16 products' path (show_config's
    ``isa`` and ``bf16_products``), for instance ``attngeom avx2 level, bfloat16 products
    widened``. The same CPU runs another level where a hypervisor hides its AVX-512 state, so
    a speed figure names both."""
    config = ag.show_config(file=io.StringIO())
    return f"attngeom {config['isa']} level, bfloat16 products {config['bf16_products']}"


def print_threads(**anchors) -> dict:
    """Print the line ``threads: attngeom N, numpy_blas M, torch K, ...`` and the processor
    with attngeom's level (:func:`cpu_name`, :func:`build_line`), and return
    :func:`thread_counts`."""
    counts = thread_counts(**anchors)
    print("threads: " + ", ".join(f"{k} {v}" for k, v in counts.items()), flush=True)
    print(f"cpu: {cpu_name()}; {build_line()}", flush=True)
    return counts


def planted() -> bool:
    """Whether ``ATTNGEOM_BENCH_PLANT`` names the running benchmark (or is ``all``)."""
    names = {n.strip() for n in os.environ.get(PLANT_VARIABLE, "").split(",") if n.strip()}
    name = bench_name()
    return bool(names & {"all", name, name.removeprefix("bench_")})


def agree(case: str, ours, anchor, *, rtol: float, atol: float = 0.0, above_only: bool = False,
          show: bool = True) -> dict:
    """Compare attngeom's output `ours` with the anchor's (same shape; any numbers, compared
    in float64) and record the check.

    The error is the largest absolute difference; the relative error divides it by the
    anchor's largest magnitude (None for an anchor of zeros). The check passes when the error is at most
    ``atol + rtol * max|anchor|`` (and everything is finite); rtol = atol = 0 asks for equality
    (ranks, counts). With `above_only` only ours above the anchor counts (a figure where lower
    is better, such as a reconstruction's error against the truth: ours may beat the
    anchor's, not fall behind it by more than the tolerance). With ``ATTNGEOM_BENCH_PLANT``
    naming this benchmark, twice the bound (1 where it is 0) is added to `ours` first (to
    the larger of ours and the anchor's with `above_only`). Prints
    the check's line unless `show` is False (a table printing the error itself); a failed
    check is printed by :func:`finish` anyway. Returns the record: case, max_abs_error,
    max_rel_error, bound, rtol, atol, above_only, ok, planted.
    """
    a = np.asarray(anchor, dtype=np.float64)
    o = np.asarray(ours, dtype=np.float64)
    if o.shape != a.shape:
        raise ValueError(f"agree({case!r}): attngeom's output has shape {o.shape}, the anchor's {a.shape}")
    scale = float(np.max(np.abs(a))) if a.size else 0.0
    bound = atol + rtol * scale
    plant = planted()
    if plant:
        o = (np.maximum(o, a) if above_only else o) + (2 * bound if bound > 0 else 1.0)
    diff = np.maximum(o - a, 0) if above_only else np.abs(o - a)
    err = float(np.max(np.where(np.isnan(diff), np.inf, diff))) if a.size else 0.0
    rel = err / scale if scale > 0 else (0.0 if err == 0 else None)  # None: an anchor of zeros
    record = {"case": case, "max_abs_error": err, "max_rel_error": rel, "bound": bound, "rtol": rtol, "atol": atol,
              "above_only": above_only, "ok": bool(err <= bound), "planted": plant}
    _checks.append(record)
    if show:
        print(check_line(record), flush=True)
    return record


def fail(case: str, reason: str) -> dict:
    """Record a check that could not be made because attngeom's side or the anchor's failed
    to produce an output (a crashed child process, say): it counts as a disagreement."""
    record = {"case": case, "max_abs_error": float("inf"), "max_rel_error": None, "bound": 0.0, "rtol": 0.0,
              "atol": 0.0, "above_only": False, "ok": False, "planted": planted(), "reason": reason}
    _checks.append(record)
    print(check_line(record), flush=True)
    return record


def check_line(r: dict) -> str:
    """One check as printed: ``agree <case>: max abs err .., rel .. (tolerance ..) ok|DISAGREES``."""
    if "reason" in r:
        return f"agree {r['case']}: DISAGREES (no output to compare: {r['reason']})"
    return (f"agree {r['case']}: max {'excess' if r['above_only'] else 'abs err'} {r['max_abs_error']:.2e}, rel "
            f"{_rel(r)} (tolerance rtol {r['rtol']:g}, atol {r['atol']:g}) "
            f"{'ok' if r['ok'] else 'DISAGREES'}"
            + (" [planted]" if r["planted"] else ""))


def _rel(r: dict) -> str:
    return "-" if r["max_rel_error"] is None else f"{r['max_rel_error']:.2e}"


def checks() -> list:
    """The checks recorded so far in this process."""
    return list(_checks)


_STATUS = {"VmRSS": "rss", "VmHWM": "peak", "RssAnon": "rss_anon", "RssFile": "rss_file"}


def memory_mb() -> dict:
    """This process's resident set now (``rss``, VmRSS; of it ``rss_anon`` and ``rss_file``,
    the pages of mapped files such as a memory-mapped checkpoint) and its peak since the
    process started (``peak``, VmHWM), in MB, from /proc/self/status. Not ru_maxrss: Linux
    carries it across fork and exec, so a child would report its parent's size when that was
    larger."""
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in _STATUS:
                out[_STATUS[key]] = int(value.split()[0]) / 1024
    return out


def reset_peak_rss() -> bool:
    """Reset the peak of :func:`memory_mb` (VmHWM) to the current resident set (Linux
    /proc/self/clear_refs); False where that is not possible."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def after_load() -> dict:
    """The :func:`memory_mb` reading once a model is loaded, its peak then reset
    (``peak_reset`` says whether it could be), so that a later reading's peak is the peak of
    what ran after loading, not the loading's own transient peak."""
    reading = memory_mb()
    reading["peak_reset"] = reset_peak_rss()
    return reading


def memory_figures(loaded: dict, end: dict) -> dict:
    """The two memory figures of a model's forward passes, from the :func:`after_load`
    reading and a :func:`memory_mb` reading after the passes: ``peak_rss_mb``, the process's
    peak resident set (loading included), and ``activation_mb``, the peak while the passes
    ran minus the resident set after loading (what the passes add to the loaded model; it
    includes the loading's transient peak where ``peak_reset`` is False)."""
    return {"peak_rss_mb": max(loaded["peak"], end["peak"]), "rss_after_load_mb": loaded["rss"],
            "load_peak_rss_mb": loaded["peak"], "forward_peak_rss_mb": end["peak"],
            "activation_mb": end["peak"] - loaded["rss"], "peak_reset_after_load": loaded["peak_reset"]}


def _child_command(code: str, args, threads: int, constants: dict):
    """The argv and environment of a fresh Python process running `code` (:func:`run_child`)."""
    prelude = "".join(f"{k} = {v!r}\n" for k, v in {"BENCHMARKS": str(Path(__file__).resolve().parent),
                                                      **constants}.items())
    return ([sys.executable, "-c", prelude + code, *map(str, args)],
            dict(os.environ, OMP_NUM_THREADS=str(threads)))


def _last_error(stderr: str, returncode) -> dict:
    return {"error": (stderr.strip().splitlines() or [f"exit code {returncode}"])[-1]}


def run_child(code: str, *args, threads: int, **constants) -> dict:
    """Run `code` in a fresh Python process (a fresh resident set: each memory figure is its
    own process's) with `args` as sys.argv[1:], OMP_NUM_THREADS = `threads`, and `constants`
    and ``BENCHMARKS`` (this folder, for ``from harness import ...``) defined first. Returns
    the JSON of its last line of output, or {"error": its last line of stderr}."""
    argv, env = _child_command(code, args, threads, constants)
    p = subprocess.run(argv, capture_output=True, text=True, env=env)
    if p.returncode:
        return _last_error(p.stderr, p.returncode)
    return json.loads(p.stdout.strip().splitlines()[-1])


class _TurnChild:
    """A child of :func:`run_in_turns`: its process, its stderr in a file, its CPU time."""

    def __init__(self, code, args, threads, constants):
        argv, env = _child_command(code, args, threads, constants)
        self.stderr = tempfile.TemporaryFile(mode="w+")
        self.process = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.stderr,
                                        text=True, env=env)

    def reply(self) -> dict:
        """The child's next JSON line, or {"error": ...} when it exits first."""
        for line in self.process.stdout:
            line = line.strip()
            if line.startswith("{"):
                try:
                    return json.loads(line)
                except ValueError:
                    continue
        self.process.wait()
        self.stderr.seek(0)
        return _last_error(self.stderr.read(), self.process.returncode)

    def send(self, word: str) -> bool:
        try:
            self.process.stdin.write(word + "\n")
            self.process.stdin.flush()
            return True
        except (BrokenPipeError, ValueError):
            return False

    def cpu_seconds(self) -> float:
        """User and system time of the process's threads so far (/proc/<pid>/stat); 0 once it is gone."""
        try:
            with open(f"/proc/{self.process.pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except (OSError, IndexError, ValueError):
            return 0.0

    def close(self):
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self.stderr.close()


def run_in_turns(children: dict, rounds: int, *, pause: float = 0.5, admit=None) -> dict:
    """Time several libraries' forwards round by round, each in its own fresh process, all
    resident at once.

    Each child (name -> (code, args, threads, constants), as :func:`run_child` takes them;
    the code calls :func:`measure_forward` with ``turns=True``) is started in turn and
    loads its model and runs its warm-up before the next starts. Then, `rounds` times, each
    child runs one timed forward while the others wait, in an order rotated by one each
    round, `pause` seconds apart (for worker threads that spin after a call to sleep). A
    slow spell of the machine then slows every library's forward of a round alike, so the
    ratios of one round's times cancel it: pass each result's ``times`` to
    :func:`round_ratio`.

    admit(name) -> None or a reason: asked just before a child starts (the others are loaded
    then, so a memory estimate can see what they hold); a reason skips it.

    Returns name -> the child's final JSON (:func:`measure_forward`'s, its ``times`` in
    round order), {"skipped": reason} or {"error": ...} (a child that fails is dropped from
    the later rounds), each with ``others_cpu``: the most CPU time the other, waiting
    processes took during one of its forwards, as a share of one CPU over that forward (near
    0 when the waiting libraries are idle, as they should be)."""
    import time

    started, results = {}, {}
    try:
        for name, (code, args, threads, constants) in children.items():
            reason = admit(name) if admit else None
            if reason:
                results[name] = {"skipped": reason}
                continue
            child = _TurnChild(code, args, threads, constants)
            ready = child.reply()
            if "error" in ready:
                results[name] = ready
                child.close()
                continue
            started[name] = child
        others = {name: 0.0 for name in started}
        names = list(started)
        for r in range(rounds if names else 0):
            for name in names[r % len(names):] + names[:r % len(names)]:
                if name in results:
                    continue
                time.sleep(pause)
                before = {o: c.cpu_seconds() for o, c in started.items() if o != name and o not in results}
                t0 = time.perf_counter()
                reply = started[name].reply() if started[name].send("go") else {"error": "the process exited"}
                wall = time.perf_counter() - t0
                if "error" in reply:
                    results[name] = reply
                    continue
                spent = sum(started[o].cpu_seconds() - t for o, t in before.items())
                others[name] = max(others[name], spent / wall if wall > 0 else 0.0)
        for name, child in started.items():
            if name not in results:
                results[name] = child.reply() if child.send("end") else {"error": "the process exited"}
                if "error" not in results[name]:
                    results[name]["others_cpu"] = others[name]
    finally:
        for child in started.values():
            child.close()
    return {name: results[name] for name in children}


def round_ratio(anchor_times, times) -> Optional[float]:
    """The median over rounds of anchor / ours, from two :func:`run_in_turns` children's
    ``times`` (round by round); None when they are not of the same rounds."""
    import statistics

    if not anchor_times or len(anchor_times) != len(times):
        return None
    return statistics.median(a / t for a, t in zip(anchor_times, times))


def measure_forward(load, forward, logits, repeats: int, logits_file: str, *, turns: bool = False) -> dict:
    """A model's forward pass as the memory benchmarks measure it, in a fresh process: the
    model from ``load()``, the :func:`after_load` reading, one warm-up ``forward(model)``,
    then `repeats` timed ones; ``logits(output)`` of the last is saved to `logits_file`
    (.npy, float64) for the parent to compare. Returns seconds (the median; None for no timed
    call), times, the
    :func:`memory_figures` and the :func:`thread_counts` of the process.

    With ``turns=True`` (a child of :func:`run_in_turns`) it prints ``{"ready": true}``
    after the warm-up, then runs one timed forward for each line ``go`` on stdin (printing
    ``{"time": seconds}``) until the line ``end``; `repeats` is not used."""
    import statistics
    import time

    model = load()
    loaded = after_load()
    out = forward(model)
    times = []

    def timed():
        nonlocal out
        t0 = time.perf_counter()
        out = forward(model)
        times.append(time.perf_counter() - t0)

    if turns:
        print(json.dumps({"ready": True}), flush=True)
        for line in sys.stdin:
            if line.strip() != "go":
                break
            timed()
            print(json.dumps({"time": times[-1]}), flush=True)
    else:
        for _ in range(repeats):
            timed()
    np.save(logits_file, np.asarray(logits(out), np.float64))
    return {"seconds": statistics.median(times) if times else None, "times": times,
            **memory_figures(loaded, memory_mb()), "threads": thread_counts()}


def machine(**fields) -> dict:
    """The run's metadata: the thread counts (:func:`thread_counts`), `fields`, the NumPy
    and Python versions, the CPU count, the processor (:func:`cpu_name`) and attngeom's
    level and bfloat16 path (:func:`build_line`)."""
    return {"threads": thread_counts(), **fields, "numpy": np.__version__,
            "python": platform.python_version(), "cpu_count": os.cpu_count(), "cpu": cpu_name(),
            "build": build_line()}


def write(out, name: str, **payload) -> Path:
    """Write `payload` as ``<out>/<name>.json`` (the directory is created), say so, return the path."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}.json"
    path.write_text(json.dumps(payload, indent=2, default=_jsonable) + "\n")
    print(f"wrote {path}")
    return path


def _jsonable(x):
    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, np.ndarray):
        return x.tolist()
    raise TypeError(f"{type(x).__name__} is not JSON serialisable")


def finish(out, name: str, **payload) -> int:
    """Write ``<out>/<name>.json`` with `payload`, the checks (``"agreement"``) and the thread
    counts (``"threads"``, unless `payload` has them), print the agreement summary line and
    return the exit status: 0 when every check is within its tolerance, 1 otherwise or when
    the benchmark recorded no check at all."""
    records = checks()
    bad = [r for r in records if not r["ok"]]
    ok = bool(records) and not bad
    payload.setdefault("threads", thread_counts())
    write(out, name, **payload, agreement={"ok": ok, "planted": planted(), "checks": records})
    bench = bench_name()
    for r in bad:
        print(check_line(r), flush=True)
    if not records:
        print(f"agreement {bench}: FAILED, no check recorded", flush=True)
    elif bad:
        cases = "; ".join(r["case"] for r in bad[:4]) + ("; ..." if len(bad) > 4 else "")
        print(f"agreement {bench}: FAILED, {len(bad)} of {len(records)} checks beyond tolerance: {cases}", flush=True)
    else:
        worst = max(records, key=lambda r: r["max_abs_error"] / r["bound"] if r["bound"] > 0 else 0.0)
        print(f"agreement {bench}: ok, {len(records)} checks within tolerance; worst {worst['case']}: rel "
              f"{_rel(worst)}, max abs err {worst['max_abs_error']:.2e} "
              f"({worst['max_abs_error'] / worst['bound'] if worst['bound'] else 0:.2g} of its tolerance)", flush=True)
    return 0 if ok else 1


def attention_inputs(rng: np.random.Generator, heads: int, d: int, lengths):
    """The attention benchmarks' sweep: for float32 then float64, non-causal then causal, and
    each sequence length n in `lengths`, (dtype name, causal, n, (q, k, v)) with q, k, v drawn
    standard normal of shape (heads, n, d), in that order from `rng`."""
    for dtype in (np.float32, np.float64):
        for causal in (False, True):
            for n in lengths:
                yield np.dtype(dtype).name, causal, n, tuple(rng.standard_normal((heads, n, d)).astype(dtype)
                                                             for _ in range(3))
