"""Test the wheel as users get it (`make test-wheel`).

Installs dist/'s wheel into a fresh virtual environment whose PATH holds no compiler, CMake or
Ninja (CC=false, CXX=false), times the install and `import attngeom`, and runs the tests from a
copy of tests/ in a temporary folder outside the source tree (with the documents the tests
read: README, docs, notebooks, benchmarks, cpp, pyproject.toml; never python/), so only the
installed package can be imported. The times go to dist/test-wheel.txt.

    python tools/test_wheel.py [--dist dist] [--venv .venv-wheel] [--tests all|ci]

--tests all runs the whole suite with the extras `make test` installs (test, models, compare);
--tests ci the C++-backed tests and the packaging checks with the test extra (`.ci/run`).
--installed runs the tests against the attngeom already installed in this interpreter
(cibuildwheel's test command) instead of building an environment.
"""
from __future__ import annotations

import argparse
import glob
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# What the tests read beside themselves (the package itself is never copied).
DOCUMENTS = ["tests", "docs", "notebooks", "benchmarks", "cpp", "README.md", "pyproject.toml", "Makefile",
             "constraints.txt", "CITATION.cff", "LICENSE"]
IGNORE = shutil.ignore_patterns("__pycache__", "*.pyc", "_build", "results", ".ipynb_checkpoints")
# The CI set: every test of the compiled core (each kernel, the levels, determinism), the
# configuration and the packaging checks (the wheel's contents, the version, the typing marker).
CI_TESTS = ["attention", "attention_backward", "variants_backward", "kernels", "lightning", "radon", "whitening",
            "dimension", "stable_density", "random_features", "laplace_radon", "spectral", "isa", "determinism", "bf16",
            "attention_bf16", "config", "packaging", "wheel", "typing"]
EXTRAS = {"all": "test,models,compare", "ci": "test"}
# Programs that could build attngeom from source (x86_64-linux-gnu-g++-12, clang++-16, cmake, ...);
# the test environment's PATH has none of them.
COMPILER = re.compile(r"^(.*-)?(cc|c\+\+|cpp|gcc|g\+\+|clang|clang\+\+|clang-cpp|ld|ld\.\w+|as|cmake|ninja|make|"
                      r"gfortran|icx|icpx|nvcc)(-[0-9.]+)?$|^(gcc|g\+\+|clang|cc1|lto)")
MAX_INSTALL_S = float(os.environ.get("WHEEL_MAX_INSTALL_S", 30))
MAX_IMPORT_S = float(os.environ.get("WHEEL_MAX_IMPORT_S", 0.5))


def _is_compiler(name: str) -> bool:
    return COMPILER.search(name) is not None


def no_compiler_bin(folder: str) -> str:
    """A folder of links to the system's programs, less every compiler, linker and build tool."""
    os.makedirs(folder)
    for directory in ("/usr/local/bin", "/usr/bin", "/bin"):
        if not os.path.isdir(directory):
            continue
        for name in sorted(os.listdir(directory)):
            link = os.path.join(folder, name)
            if not _is_compiler(name) and not os.path.lexists(link):
                os.symlink(os.path.join(directory, name), link)
    return folder


def cpu() -> str:
    try:
        info = dict(line.split(":", 1) for line in open("/proc/cpuinfo").read().split("\n\n")[0].splitlines()
                    if ":" in line)
        info = {k.strip(): v.strip() for k, v in info.items()}
        return f"{info.get('model name', '?')} (family {info.get('cpu family', '?')}, model {info.get('model', '?')})"
    except OSError:
        return platform.processor() or platform.machine()


def run(cmd, **kw):
    print("+", " ".join(cmd), flush=True)
    return subprocess.run(cmd, check=True, **kw)


def copy_tests(project: str, dest: str) -> str:
    for name in DOCUMENTS:
        source = os.path.join(project, name)
        if os.path.isdir(source):
            shutil.copytree(source, os.path.join(dest, name), ignore=IGNORE)
        elif os.path.exists(source):
            shutil.copy2(source, dest)
    assert not os.path.exists(os.path.join(dest, "python")), "the package sources must not be copied"
    return dest


# Tests that need build tools themselves, which this environment removes by design (make test
# runs them): torch.compile's inductor backend compiles C++ for the CPU with the system's
# compiler, and the Makefile's build commands are read from `make -n`.
NEEDS_COMPILER = ["tests/test_torch_bridge.py::test_torch_compile_one_call",
                  "tests/test_packaging.py::test_make_builds_compile_through_ccache_when_one_is_given"]


def pytest_args(tests: str) -> list:
    paths = ["tests"] if tests == "all" else [f"tests/test_{name}.py" for name in CI_TESTS]
    return paths + [f"--deselect={test}" for test in NEEDS_COMPILER]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dist", default="dist")
    parser.add_argument("--venv", default=".venv-wheel")
    parser.add_argument("--tests", choices=sorted(EXTRAS), default="all")
    parser.add_argument("--installed", action="store_true", help="test the attngeom this interpreter has")
    parser.add_argument("--project", default=ROOT, help="the source tree whose tests/ is copied")
    parser.add_argument("--workers", type=int, default=0,
                        help="test processes (pytest-xdist, in the test extra); 0 runs the tests in one process")
    args = parser.parse_args(argv)

    work = tempfile.mkdtemp(prefix="attngeom-wheel-tests-")
    env = dict(os.environ)
    lines = []
    try:
        if args.installed:
            python = sys.executable
        else:
            dist = os.path.abspath(args.dist)
            wheels = glob.glob(os.path.join(dist, "attngeom-*.whl"))
            sdists = glob.glob(os.path.join(dist, "attngeom-*.tar.gz"))
            if len(wheels) != 1 or len(sdists) != 1:
                print(f"test-wheel: expected one wheel and one sdist in {dist} (make wheel), got {wheels + sdists}")
                return 1
            wheel = wheels[0]
            venv = os.path.abspath(args.venv)
            shutil.rmtree(venv, ignore_errors=True)
            run([sys.executable, "-m", "venv", venv])
            python = os.path.join(venv, "bin", "python")
            env.update(PATH=os.path.join(venv, "bin") + os.pathsep + no_compiler_bin(os.path.join(work, "bin")),
                       CC="false", CXX="false", ATTNGEOM_WHEEL=wheel, ATTNGEOM_SDIST=sdists[0],
                       ATTNGEOM_TEST_WHEEL="1")
            env.pop("VIRTUAL_ENV", None)
            start = time.perf_counter()
            run([python, "-m", "pip", "install", "--quiet", "--only-binary=:all:", wheel], env=env)
            install_s = time.perf_counter() - start
            imports = []
            for _ in range(5):
                out = subprocess.run([python, "-c", "import time; t = time.perf_counter(); import attngeom; "
                                      "print(time.perf_counter() - t)"], env=env, cwd=work, check=True,
                                     capture_output=True, text=True).stdout
                imports.append(float(out))
            version = subprocess.run([python, "-m", "attngeom", "--version"], env=env, cwd=work, check=True,
                                     capture_output=True, text=True).stdout.strip()
            lines = [f"wheel        {os.path.basename(wheel)} ({os.path.getsize(wheel) / 2**20:.2f} MiB)",
                     f"sdist        {os.path.basename(sdists[0])} ({os.path.getsize(sdists[0]) / 2**20:.2f} MiB)",
                     f"install      {install_s:.1f} s (pip install of the wheel and its dependencies into a fresh venv)",
                     f"import       {statistics.median(imports):.3f} s median of 5 (first {imports[0]:.3f} s), "
                     "`import attngeom` in a new process",
                     f"version      {version}",
                     f"cpu          {cpu()}, {os.cpu_count()} cores; Python {platform.python_version()}"]
            print("\n".join(lines), flush=True)
            constraints = os.path.join(args.project, "constraints.txt")
            run([python, "-m", "pip", "install", "--quiet", "--prefer-binary", "-c", constraints,
                 f"{wheel}[{EXTRAS[args.tests]}]"], env=env)
        tests = copy_tests(args.project, os.path.join(work, "tree"))
        if args.tests == "ci":
            env["ATTNGEOM_ALLOWED_SKIPS"] = os.path.join(tests, "tests", "allowed_skips_wheel.txt")
        start = time.perf_counter()
        workers = ["-n", str(args.workers), "--dist", "worksteal"] if args.workers > 0 else []
        status = subprocess.run([python, "-m", "pytest", "-q", "-p", "no:cacheprovider", *workers,
                                 *pytest_args(args.tests)],
                                env=env, cwd=tests).returncode
        lines.append(f"tests        {args.tests}: {'passed' if status == 0 else 'FAILED'} in "
                     f"{time.perf_counter() - start:.0f} s")
        print(lines[-1])
        if not args.installed:
            with open(os.path.join(os.path.abspath(args.dist), "test-wheel.txt"), "w") as f:
                f.write("\n".join(lines) + "\n")
            slow = [f"install {install_s:.1f} s > {MAX_INSTALL_S} s"] * (install_s > MAX_INSTALL_S) + \
                [f"import {statistics.median(imports):.3f} s > {MAX_IMPORT_S} s"] * (
                    statistics.median(imports) > MAX_IMPORT_S)
            if slow:
                print("test-wheel: too slow: " + "; ".join(slow))
                status = status or 1
        return status
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
