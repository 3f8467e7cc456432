"""Scheduling policies, chosen by name from a registry (see `registry.py`)."""
