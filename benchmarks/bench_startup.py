"""A 10,000-request `sim run`, whole process, on this source tree and optionally on another, alternating.

The scenario is bench_fleet.py's `vllm` one (ShareGPT-like requests on Llama-2-7B / A100-80GB, Poisson
arrivals at `--rate`, 10.963 req/s, held fixed so that timings stay comparable: 70% of the policy's saturation
when it was set, 74% of today's 14.9 req/s; the run drains). Each tree runs
`python -m sim run SCENARIO --out TMP --force` as a child process, from its own root with its own
PYTHONPATH, and the kernel's accounting of that child (`os.wait4`) gives its user + system CPU seconds and
wall seconds: interpreter start, imports, the run, the records, the table and the exit all count. CPU time
is the figure to compare on a shared machine; the trees take turns so that both see the same load.

Bytecode is cached as an installed package has it (each tree gets its own `PYTHONPYCACHEPREFIX` under the
temporary folder, written by one untimed run first); `--no-bytecode-cache` times source compilation too
(PYTHONDONTWRITEBYTECODE=1). With `--base`, the records of the two trees (`requests.parquet`,
`steps.parquet`, `summary.json`, `manifest.json`) must be byte-identical, else the script exits with an error.

    .venv/bin/python benchmarks/bench_startup.py                           # this tree, medians of 8
    git archive COMMIT | tar -x -C OLD_SRC
    .venv/bin/python benchmarks/bench_startup.py --base OLD_SRC --repeat 8  # both, and the ratio
"""

from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_fleet  # noqa: E402  (the benchmark next to this one: its scenario)

ROOT = Path(__file__).resolve().parent.parent
RECORDS = ("requests.parquet", "steps.parquet", "summary.json", "manifest.json")


def run_once(tree: Path, scenario: Path, out: Path, env: dict[str, str]) -> tuple[float, float]:
    """(CPU seconds, wall seconds) of one `sim run` of `scenario` with the sources in `tree`."""
    cmd = [sys.executable, "-m", "sim", "run", str(scenario), "--out", str(out), "--force"]
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=tree, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    assert proc.stderr is not None
    err = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit(f"error: {' '.join(cmd)} (in {tree}) failed:\n{err.decode()[-2000:]}")
    return usage.ru_utime + usage.ru_stime, wall


def digests(folder: Path) -> dict[str, str]:
    """sha256 of each record file of the run folder's policy folders."""
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.glob("*/*"))
        if p.name in RECORDS
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=10_000)
    ap.add_argument("--rate", type=float, default=10.963, help="Poisson arrivals per second")
    ap.add_argument("--policy", choices=sorted(bench_fleet.POLICIES), default="vllm")
    ap.add_argument("--gpu", default="A100-80GB", help="the scenario's GPU (a catalogue name)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeat", type=int, default=8, help="timed runs per tree (medians of them)")
    ap.add_argument("--base", type=Path, help="another source tree (e.g. an older commit's export)")
    ap.add_argument("--no-bytecode-cache", action="store_true", help="compile the sources in every run")
    args = ap.parse_args()
    if args.requests < 1 or args.rate <= 0 or args.repeat < 1:
        ap.error("--requests, --rate and --repeat must be positive")
    trees = {"this tree": ROOT}
    if args.base is not None:
        if not (args.base / "sim" / "__main__.py").is_file():
            ap.error(f"--base {args.base}: no sim/__main__.py there")
        trees["base"] = args.base.resolve()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        scenario = work / "scenario.toml"
        arrival = f'{{ kind = "poisson", rate = {args.rate!r} }}'
        toml = bench_fleet.scenario_toml(args.policy, args.requests, arrival, args.seed, args.gpu)
        scenario.write_text(toml)
        envs, outs = {}, {}
        for i, (name, tree) in enumerate(trees.items()):
            env = {k: v for k, v in os.environ.items() if k not in ("PYTHONDONTWRITEBYTECODE", "PYTHONPATH")}
            env["PYTHONPATH"] = str(tree)
            if args.no_bytecode_cache:
                env["PYTHONDONTWRITEBYTECODE"] = "1"
            else:
                env["PYTHONPYCACHEPREFIX"] = str(work / f"pycache-{i}")
            envs[name], outs[name] = env, work / f"out-{i}"
            run_once(tree, scenario, outs[name], env)  # untimed: writes the bytecode cache
        if "base" in trees and digests(outs["base"]) != digests(outs["this tree"]):
            sys.exit("error: the two trees' records differ")
        cpu: dict[str, list[float]] = {name: [] for name in trees}
        wall: dict[str, list[float]] = {name: [] for name in trees}
        for _ in range(args.repeat):
            for name, tree in trees.items():
                c, w = run_once(tree, scenario, outs[name], envs[name])
                cpu[name].append(c)
                wall[name].append(w)
    print(f"sim run, {args.policy} on {args.gpu}, {args.requests:,} requests at {args.rate} req/s; "
          f"{args.repeat} runs each")  # fmt: skip
    print(f"{'tree':<10} {'cpu s':>7} {'wall s':>7}  cpu s of each run (medians in the first columns)")
    for name in trees:
        runs = " ".join(f"{c:.2f}" for c in cpu[name])
        mid_cpu, mid_wall = statistics.median(cpu[name]), statistics.median(wall[name])
        print(f"{name:<10} {mid_cpu:>7.3f} {mid_wall:>7.3f}  {runs}")
    if "base" in trees:
        for what, times in (("CPU", cpu), ("wall", wall)):
            pairs = [a / b for a, b in zip(times["this tree"], times["base"], strict=True)]
            ratio = statistics.median(times["this tree"]) / statistics.median(times["base"])
            mid, low, high = statistics.median(pairs), min(pairs), max(pairs)
            print(f"{what} this tree / base: {ratio:.3f} (medians), {mid:.3f} (median of the {len(pairs)} "
                  f"pairs, {low:.3f}-{high:.3f})")  # fmt: skip
        print("records byte-identical")


if __name__ == "__main__":
    main()
