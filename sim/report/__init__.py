"""The HTML report of a scenario's runs and sweep (altair charts, rendered offline)."""

from sim.report.build import build_report

__all__ = ["build_report"]
