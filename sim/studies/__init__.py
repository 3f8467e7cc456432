"""The work behind each command: one run, a sweep, a plan, capacity figures, fidelity against real runs, the
calibration fit, the scheduler replay. The pages and tables that show the results are in `sim.report`."""
