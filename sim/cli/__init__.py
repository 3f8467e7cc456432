"""The `sim` command line. Each command is a thin wrapper over a module that does the work; the commands are
grouped by what they answer (`runs`, `plan`, `models`, `fidelity`) and registered on one app (`app`)."""

from __future__ import annotations

from sim.cli import fidelity, models, plan, runs  # noqa: F401  (each registers its commands on the app)
from sim.cli.app import app, entry, main

# `sim --help` lists the commands in this order: a scenario's runs first, then planning, model questions,
# and the checks against measurements.
ORDER = ("run", "sweep", "report", "plan", "capacity", "step", "kernels", "schema", "validate", "calibrate",
         "papers", "replay-steps")  # fmt: skip
app.registered_commands.sort(key=lambda command: ORDER.index(command.name or ""))

__all__ = ["app", "entry", "main"]
