"""Fleets: several replicas on one clock behind a router, colocated or with prefill and decode split."""
