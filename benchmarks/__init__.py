"""Benchmarks of mimo against the Hugging Face baseline in baseline/ (run as `python -m benchmarks.bench_vlm`)."""
