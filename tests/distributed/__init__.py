"""Multi-process tests on gloo (each bounded by a timeout), against a single-process reference."""
