"""The requests of a run: arrival processes, trace replay, length samplers and adapter draws, drawn from a
seed by `generator.Workload`."""
