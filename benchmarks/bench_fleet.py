"""Fleet-scale speed and memory: the whole `sim run` process against the floor, in one run.

For each request count in `--sizes` and each policy in `--policies`, this writes a ShareGPT-like scenario
(Llama-2-7B on A100-80GB; prompts lognormal mean 160 tokens, outputs lognormal mean 340, both cv 1.0 and
capped at 2048; `max_tokens = 2048`; `max_num_seqs = 256`; Poisson arrivals; the run drains) and times
`python -m sim run SCENARIO --out TMP` as a child process: wall seconds from start to exit, CPU seconds and
peak RSS from the kernel's accounting of that one child (`os.wait4`). Everything the command does counts:
interpreter start, imports, generating and simulating the requests, the records, Parquet and summary.json.
`benchmarks/floor.py` (the bare SimPy loop) runs as a child process the same way, on the same request count.

The offered load is `--load` (0.7) times each policy's own saturation, which is measured, not assumed: a first
`sim run` offers `--saturation-requests` requests at once (deterministic arrivals at 1e6 per second, the most
a scenario accepts) and takes the completion rate between the 10th and 90th percentile finish times. Both
runs are seeded, so the rates and every simulated figure are the same on each run; only the timings vary.

The table gives, per run: requests per wall second, the ratio to the floor's requests per wall second (whole
process on both sides), and the peak RSS. Below it, the checks of the fleet-scale targets: the `vllm` policy
at least as fast as the floor at 100,000 requests, and peak RSS at 20,000 and at 1,000,000 requests within
200 MB of each other. With a largest size under 1,000,000 the memory check also gives the linear extrapolation
to 1,000,000, marked as such. The `no steps` row (`benchmarks/fixed_cost.py`, whole process, on the `vllm`
policy's stream) starts up, generates the requests and records each as finished without running any step:
what every policy pays before scheduling, so the floor's time over it bounds any policy's `x floor`.
The `same steps (POLICY)` rows (`benchmarks/same_steps_floor.py`, whole process and loop alone) replay that
policy's own run, its steps and its arrivals, through a bare SimPy loop; `x same` is the policy's requests per
wall second over that process's, the floor that takes the same steps as the run.

    .venv/bin/python benchmarks/bench_fleet.py                          # 20k, 100k, 200k: a few minutes
    .venv/bin/python benchmarks/bench_fleet.py --sizes 20000 100000 1000000   # the full check (long)
    .venv/bin/python benchmarks/bench_fleet.py --sizes 100000 --repeat 3      # medians of 3
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import polars as pl

ROOT = Path(__file__).resolve().parent.parent
FLOOR = ROOT / "benchmarks" / "floor.py"
FIXED_COST = ROOT / "benchmarks" / "fixed_cost.py"
SAME_STEPS = ROOT / "benchmarks" / "same_steps_floor.py"
MIB = 1024 * 1024
SPEED_SIZE, MEMORY_SIZES, MEMORY_TARGET_MB = 100_000, (20_000, 1_000_000), 200.0

POLICIES = {
    "vllm": 'scheduler = "vllm"\nmax_num_seqs = 256\nmax_num_batched_tokens = 8192',
    "continuous": 'scheduler = "continuous"\nmax_num_seqs = 256',
}


def scenario_toml(policy: str, requests: int, arrival: str, seed: int, gpu: str = "A100-80GB") -> str:
    """A one-policy ShareGPT-like scenario; `arrival` is the TOML inline table of the arrival process."""
    return f"""name = "bench-fleet-{policy}"
seed = {seed}

[model]
name = "llama-2-7b"
gpu = "{gpu}"
max_model_len = 4096

[workload]
arrival = {arrival}
prompt = {{ kind = "lognormal", mean = 160, cv = 1.0, max = 2048 }}
output = {{ kind = "lognormal", mean = 340, cv = 1.0, max = 2048 }}
max_tokens = 2048

[horizon]
max_requests = {requests}
drain = true

[policies.{policy}]
{POLICIES[policy]}
"""


@dataclass(frozen=True, slots=True)
class Usage:
    """One child process: wall and CPU seconds, peak resident set size (bytes)."""

    wall_s: float
    cpu_s: float
    peak_rss: int


def measure(cmd: list[str], log: Path) -> Usage:
    """Run `cmd` to its end (stdout and stderr to `log`); exit with its output if it fails."""
    with log.open("wb") as out:
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        sys.exit(f"error: {' '.join(cmd)} exited with {proc.returncode}:\n{log.read_text()[-2000:]}")
    # Linux reports ru_maxrss in KiB.
    return Usage(wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss * 1024)


def sim_run(scenario: Path, out: Path, log: Path) -> Usage:
    return measure([sys.executable, "-m", "sim", "run", str(scenario), "--out", str(out)], log)


def saturation(policy: str, requests: int, seed: int, work: Path) -> float:
    """Completions per simulated second with every request offered at once (middle 80% of finish times)."""
    scenario = work / f"saturation-{policy}.toml"
    arrival = '{ kind = "deterministic", rate = 1e6 }'  # the most a scenario may give: all at once
    scenario.write_text(scenario_toml(policy, requests, arrival, seed))
    sim_run(scenario, work / "saturation", work / "saturation.log")
    records = work / "saturation" / policy / "requests.parquet"
    if "finished_at" not in pl.read_parquet_schema(records):
        sys.exit(f"error: {records}: finished_at: expected a column of finish times")
    done = pl.read_parquet(records, columns=["finished_at"])
    times = done["finished_at"].drop_nulls().drop_nans().sort().to_list()
    lo, hi = int(0.1 * len(times)), int(0.9 * len(times)) - 1
    return (hi - lo) / (times[hi] - times[lo])


@dataclass(frozen=True, slots=True)
class Row:
    """One timed run, medians over its repeats."""

    what: str
    requests: int
    finished: int
    wall_s: float
    cpu_s: float
    peak_rss_mib: float
    rate: float | None = None  # offered requests per simulated second (floor: None, it derives its own)
    steps: int = 0  # engine steps the run took (policies only)
    steps_per_stretch: float = math.nan  # see decode_stretches

    @property
    def requests_per_s(self) -> float:
        return self.requests / self.wall_s


def decode_stretches(steps_file: Path) -> tuple[int, float]:
    """Steps, and the mean length of the runs of steps that one computation could advance at most.

    A step joins the previous one's stretch when neither has prefill tokens and the batch size is
    unchanged (no request admitted or resumed, none finished). This can only over-count what could be
    merged (a step that finishes one request and preempts another passes as unchanged), so it bounds from
    above what advancing decode-only stretches in one computation can save: all but one step of each.
    """
    cols = pl.read_parquet(steps_file, columns=["prefill_tokens", "batch_size"])
    decode = (cols["prefill_tokens"] == 0).to_numpy()
    batch = cols["batch_size"].to_numpy()
    joins = int((decode[1:] & decode[:-1] & (batch[1:] == batch[:-1])).sum())
    n = len(batch)
    return n, n / max(n - joins, 1)


def median_usage(runs: list[Usage]) -> tuple[float, float, float]:
    return (
        statistics.median(u.wall_s for u in runs),
        statistics.median(u.cpu_s for u in runs),
        statistics.median(u.peak_rss for u in runs) / MIB,
    )


def time_policy(policy: str, requests: int, rate: float, seed: int, repeat: int, work: Path) -> list[Row]:
    """The policy's run, then its same-steps floor as a whole process and its loop alone."""
    scenario = work / f"{policy}-{requests}.toml"
    scenario.write_text(scenario_toml(policy, requests, f'{{ kind = "poisson", rate = {rate!r} }}', seed))
    runs, finished, steps, stretch = [], 0, 0, math.nan
    inputs = work / f"same-{policy}-{requests}.npz"
    for _ in range(repeat):
        out = work / f"run-{policy}-{requests}"
        runs.append(sim_run(scenario, out, work / "run.log"))
        summary = json.loads((out / policy / "summary.json").read_text())
        finished = int(summary["requests"]["finished"])
        steps, stretch = decode_stretches(out / policy / "steps.parquet")
        write_same_steps_inputs(out / policy, inputs)
        shutil.rmtree(out / policy)  # a 1e6 run writes hundreds of MB; keep one run's files at a time
    run = Row(policy, requests, finished, *median_usage(runs), rate=rate, steps=steps,
              steps_per_stretch=stretch)  # fmt: skip
    return [run, *time_same_steps(f"same steps ({policy})", inputs, requests, finished, repeat, work)]


def write_same_steps_inputs(run_dir: Path, out: Path) -> None:
    """The same-steps floor's input from a run's records (its step starts and durations, its arrivals)."""
    steps = pl.read_parquet(run_dir / "steps.parquet", columns=["start", "duration"])
    arrival = pl.read_parquet(run_dir / "requests.parquet", columns=["arrival"])["arrival"].to_numpy()
    np.savez(out, start=steps["start"].to_numpy(), duration=steps["duration"].to_numpy(), arrival=arrival)


def time_same_steps(
    what: str, inputs: Path, requests: int, finished: int, repeat: int, work: Path
) -> list[Row]:
    """`same_steps_floor.py` on a run's steps and arrivals: the whole process, and its loop alone."""
    cmd = [sys.executable, str(SAME_STEPS), str(inputs), "--json"]
    runs, loops = [], []
    for _ in range(repeat):
        log = work / "same.log"
        runs.append(measure(cmd, log))
        loops.append(float(json.loads(log.read_text().strip().splitlines()[-1])["loop_s"]))
    loop = statistics.median(loops)
    return [Row(what, requests, finished, *median_usage(runs)),
            Row(f"{what[:-1]}, loop only)", requests, finished, loop, math.nan, math.nan)]  # fmt: skip


def time_floor(requests: int, load: float, seed: int, repeat: int, work: Path) -> tuple[Row, Row]:
    """The floor as a whole process, and its loop alone (as timed inside the process)."""
    cmd = [sys.executable, str(FLOOR), "--requests", str(requests), "--load", str(load)]
    cmd += ["--seed", str(seed), "--json"]
    runs, loops, finished = [], [], 0
    for _ in range(repeat):
        log = work / "floor.log"
        runs.append(measure(cmd, log))
        report = json.loads(log.read_text().strip().splitlines()[-1])
        loops.append(float(report["loop_s"]))
        finished = int(report["finished"])
    wall, cpu, rss = median_usage(runs)
    loop = statistics.median(loops)
    return Row("floor", requests, finished, wall, cpu, rss), Row("floor (loop only)", requests, finished,
                                                                loop, math.nan, math.nan)  # fmt: skip


def time_no_steps(requests: int, rate: float, seed: int, repeat: int, work: Path) -> Row:
    """`fixed_cost.py` as a whole process: start-up, generating and recording the stream, no step."""
    cmd = [sys.executable, str(FIXED_COST), "--requests", str(requests), "--rate", repr(rate)]
    cmd += ["--seed", str(seed), "--json"]
    runs = [measure(cmd, work / "fixed.log") for _ in range(repeat)]
    return Row("no steps", requests, 0, *median_usage(runs), rate=rate)


def same_steps_of(rows: list[Row]) -> dict[tuple[str, int], Row]:
    """Each policy's same-steps floor process, by (policy, requests)."""
    return {(r.what[12:-1], r.requests): r for r in rows if r.what.startswith("same steps (") and
            not r.what.endswith("loop only)")}  # fmt: skip


def table(rows: list[Row], floors: dict[int, Row], loops: dict[int, Row]) -> str:
    """One line per run; `x floor` against the floor process, `x loop` against the floor's loop alone, and a
    policy's `x same` against its own same-steps floor process."""
    head = f"{'run':<34} {'requests':>10} {'finished':>10} {'wall s':>8} {'cpu s':>8} {'req/s':>9} "
    head += f"{'x floor':>8} {'x loop':>7} {'x same':>7} {'peak RSS MiB':>13}"
    lines = [head, "-" * len(head)]
    same = same_steps_of(rows)
    for r in rows:
        ratio = r.requests_per_s / floors[r.requests].requests_per_s
        loop = r.requests_per_s / loops[r.requests].requests_per_s
        own = same.get((r.what, r.requests))
        to_same = "" if own is None else f"{r.requests_per_s / own.requests_per_s:.2f}"
        cpu = "" if math.isnan(r.cpu_s) else f"{r.cpu_s:.2f}"
        rss = "" if math.isnan(r.peak_rss_mib) else f"{r.peak_rss_mib:,.0f}"
        lines.append(f"{r.what:<34} {r.requests:>10,} {r.finished:>10,} {r.wall_s:>8.2f} {cpu:>8} "
                     f"{r.requests_per_s:>9,.0f} {ratio:>8.2f} {loop:>7.2f} {to_same:>7} "
                     f"{rss:>13}")  # fmt: skip
    return "\n".join(lines)


def checks(rows: list[Row], floors: dict[int, Row], policies: list[str]) -> list[str]:
    """The fleet-scale targets, as far as the sizes run allow."""
    out = []
    by = {(r.what, r.requests): r for r in rows}
    if ("vllm", SPEED_SIZE) in by:
        ratio = by["vllm", SPEED_SIZE].requests_per_s / floors[SPEED_SIZE].requests_per_s
        verdict = "met" if ratio >= 1.0 else "not met"
        out.append(f"speed: vllm at {SPEED_SIZE:,} requests runs {ratio:.2f} x the floor "
                   f"(target >= 1.00): {verdict}")  # fmt: skip
    for (policy, n), own in sorted(same_steps_of(rows).items()):
        if n == SPEED_SIZE and (policy, n) in by:
            run = by[policy, n]
            times = run.requests_per_s / own.requests_per_s
            out.append(f"same steps: {policy} at {n:,} requests runs {times:.2f} "
                       f"x its own {run.steps:,} steps and {n:,} arrivals through a bare SimPy loop "
                       f"(whole processes; that loop takes {own.wall_s:.2f} s)")  # fmt: skip
    if ("no steps", SPEED_SIZE) in by:
        bound = floors[SPEED_SIZE].wall_s / by["no steps", SPEED_SIZE].wall_s
        out.append(f"bound: starting, generating and recording {SPEED_SIZE:,} requests with no step at all "
                   f"runs {bound:.2f} x the floor: no policy's process can run faster")  # fmt: skip
        for policy in policies:
            if (policy, SPEED_SIZE) not in by or not by[policy, SPEED_SIZE].steps:
                continue
            run, fixed = by[policy, SPEED_SIZE], by["no steps", SPEED_SIZE]
            budget = (floors[SPEED_SIZE].wall_s - fixed.wall_s) / run.steps * 1e6
            spent = (run.wall_s - fixed.wall_s) / run.steps * 1e6
            per_request = run.steps / SPEED_SIZE
            allows = f"{budget:.1f} us" if budget > 0 else "no time at all"
            out.append(f"steps: {policy} runs {run.steps:,} steps ({per_request:.1f} per request), "
                       f"{spent:.1f} us each over the no-step process; the floor's time allows "
                       f"{allows}; decode-only stretches average {run.steps_per_stretch:.2f} steps, "
                       f"so advancing each in one computation saves at most "
                       f"{1 - 1 / run.steps_per_stretch:.0%} of the steps' iterations")  # fmt: skip
    sizes = sorted({r.requests for r in rows})
    if len(sizes) < 2:
        return out
    small, large = sizes[0], sizes[-1]
    for policy in policies:
        if (policy, small) not in by or (policy, large) not in by:
            continue
        a, b = by[policy, small].peak_rss_mib * MIB / 1e6, by[policy, large].peak_rss_mib * MIB / 1e6
        line = f"memory: {policy} peak RSS {small:,} -> {large:,} requests: {b - a:+,.0f} MB"
        if (small, large) == MEMORY_SIZES:
            verdict = "met" if b - a <= MEMORY_TARGET_MB else "not met"
            line += f" (target <= {MEMORY_TARGET_MB:.0f} MB): {verdict}"
        else:
            lo, hi = MEMORY_SIZES
            slope = (b - a) / (large - small)
            line += (f"; linear extrapolation {lo:,} -> {hi:,}: {slope * (hi - lo):+,.0f} MB "
                     f"(target <= {MEMORY_TARGET_MB:.0f} MB; --sizes {lo} {hi} measures it)")  # fmt: skip
        out.append(line)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[20_000, SPEED_SIZE, 200_000],
                    help="request counts to run (default: 20000 100000 200000)")  # fmt: skip
    ap.add_argument("--policies", nargs="+", default=list(POLICIES), choices=list(POLICIES))
    ap.add_argument("--load", type=float, default=0.7, help="offered load, a fraction of saturation")
    ap.add_argument("--saturation-requests", type=int, default=20_000)
    ap.add_argument("--rate", type=float, default=None, help="offer this rate to every policy instead")
    ap.add_argument("--repeat", type=int, default=1, help="runs per figure; the table gives medians")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", type=Path, default=None, help="also write the rows to this JSON file")
    args = ap.parse_args()
    if min(args.sizes) < 1 or args.repeat < 1 or args.load <= 0 or args.saturation_requests < 10:
        ap.error("--sizes, --repeat and --load must be positive, --saturation-requests at least 10")

    with tempfile.TemporaryDirectory(prefix="bench-fleet-") as tmp:
        work = Path(tmp)
        rates = {}
        for policy in args.policies:
            if args.rate is not None:
                rates[policy] = args.rate
                continue
            sat = saturation(policy, args.saturation_requests, args.seed + 1, work)
            rates[policy] = args.load * sat
            print(f"{policy}: saturation {sat:.2f} req/s ({args.saturation_requests:,} requests at once); "
                  f"offered {rates[policy]:.3f} req/s", file=sys.stderr, flush=True)  # fmt: skip
        rows: list[Row] = []
        floors: dict[int, Row] = {}
        loops: dict[int, Row] = {}
        for n in sorted(set(args.sizes)):
            floor, loop = time_floor(n, args.load, args.seed, args.repeat, work)
            floors[n], loops[n] = floor, loop
            rows += [floor, loop]
            if "vllm" in rates:
                rows.append(time_no_steps(n, rates["vllm"], args.seed, args.repeat, work))
            for policy in args.policies:
                timed = time_policy(policy, n, rates[policy], args.seed, args.repeat, work)
                rows += timed
                r = timed[0]
                note = f"{policy} {n:,}: {r.wall_s:.2f} s, {r.peak_rss_mib:,.0f} MiB"
                print(note, file=sys.stderr, flush=True)

    print(f"sim run, ShareGPT-like requests on llama-2-7b / A100-80GB at {args.load:.0%} of each policy's "
          f"saturation; medians of {args.repeat}; {os.cpu_count()} CPUs, load average "
          f"{os.getloadavg()[0]:.2f}")  # fmt: skip
    print(table(rows, floors, loops))
    for line in checks(rows, floors, args.policies):
        print(line)
    if args.json is not None:
        data = [
            {
                **{k: None if isinstance(v, float) and math.isnan(v) else v for k, v in asdict(r).items()},
                "requests_per_s": r.requests_per_s,
                "ratio_to_floor": r.requests_per_s / floors[r.requests].requests_per_s,
                "ratio_to_floor_loop": r.requests_per_s / loops[r.requests].requests_per_s,
            }
            for r in rows
        ]
        args.json.write_text(json.dumps(data, indent=2) + "\n")


if __name__ == "__main__":
    main()
