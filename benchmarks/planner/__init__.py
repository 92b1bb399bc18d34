"""Configs of the planner's checks against measured steps (benchmarks/bench_planner.py)."""
