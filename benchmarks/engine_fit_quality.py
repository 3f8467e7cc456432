"""Each engine profile's measured points against its fit (in sample and leave-one-out), as docs/engines.md
quotes them: `PYTHONPATH=. python benchmarks/engine_fit_quality.py`."""

from __future__ import annotations

from sim.catalog.engines import engines
from sim.cost.engine_fit import point_errors


def main() -> None:
    for profile in engines().values():
        for fit in profile.fits:
            errors = point_errors(fit)
            if not errors:
                continue
            print(f"{profile.name}: {fit.key()}")
            print(f"  {'point':<14} {'measured ms':>12} {'fitted ms':>10} {'error':>7} {'held out':>9}")
            for e in errors:
                point = f"{e.kind} {e.size}"
                print(f"  {point:<14} {e.measured_ms:>12.1f} {e.fitted_ms:>10.1f} {e.error:>+7.1%} "
                      f"{e.held_out_error:>+9.1%}")  # fmt: skip
            worst = max(abs(e.error) for e in errors)
            held = max(abs(e.held_out_error) for e in errors)
            print(f"  largest |error|: {worst:.1%} in sample, {held:.1%} held out")
            for kind, size, why in fit.left_out:
                print(f"  left out: {kind} {size}: {why}")


if __name__ == "__main__":
    main()
