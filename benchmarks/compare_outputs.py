"""Run every scenario both trees ship with each source tree and compare their outputs file by file.

    .venv/bin/python benchmarks/compare_outputs.py --base OLD_SRC --out WORK [--new NEW_SRC]

Each tree's `sim run` writes under WORK/<tree>/<scenario>/; the report lists, per scenario and policy, each of
`requests.parquet`, `steps.parquet`, `summary.json` and `manifest.json` as byte-identical, equal in content
(Parquet read back equal; JSON equal), or different. Outputs already present are reused
(delete WORK to rerun).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import polars as pl

ROOT = Path(__file__).resolve().parent.parent
FILES = ("requests.parquet", "steps.parquet", "summary.json", "manifest.json")


def run_all(src: Path, out: Path, names: set[str]) -> None:
    env = {**os.environ, "PYTHONPATH": str(src)}
    for scenario in sorted(p for p in (ROOT / "scenarios").glob("*.toml") if p.name in names):
        target = out / scenario.stem
        if target.is_dir():
            continue
        cmd = [sys.executable, "-m", "sim", "run", str(scenario), "--out", str(target), "--force"]
        subprocess.run(cmd, cwd=src, env=env, check=True, stdout=subprocess.DEVNULL)


def compare(a: Path, b: Path) -> str:
    if a.read_bytes() == b.read_bytes():
        return "byte-identical"
    if a.suffix == ".parquet":
        fa, fb = pl.read_parquet(a), pl.read_parquet(b)
        return "equal content" if fa.equals(fb, null_equal=True) else "DIFFERENT"
    return "equal content" if json.loads(a.read_text()) == json.loads(b.read_text()) else "DIFFERENT"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", type=Path, required=True, help="the source tree to compare against")
    ap.add_argument("--new", type=Path, default=ROOT, help="the source tree under test (default: this one)")
    ap.add_argument("--out", type=Path, required=True, help="work folder for both trees' outputs")
    args = ap.parse_args()
    shared = {p.name for p in (args.base / "scenarios").glob("*.toml")}  # scenarios both trees ship
    run_all(args.base.resolve(), args.out / "base", shared)
    run_all(args.new.resolve(), args.out / "new", shared)
    bad = 0
    for folder in sorted((args.out / "base").glob("*/*/")):
        other = args.out / "new" / folder.relative_to(args.out / "base")
        for name in FILES:
            verdict = compare(folder / name, other / name) if (other / name).exists() else "MISSING"
            bad += verdict in ("DIFFERENT", "MISSING")
            print(f"{folder.parent.name}/{folder.name}/{name}: {verdict}")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
