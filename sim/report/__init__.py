"""Everything a person reads: the HTML report of a scenario's runs and sweep (altair charts, rendered
offline), the plan and fidelity pages and files, and the terminal tables."""

from sim.report.build import build_report

__all__ = ["build_report"]
