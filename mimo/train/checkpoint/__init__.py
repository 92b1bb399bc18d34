"""Checkpoints: final weights, the step store, resume, resharding across layouts, safe DCP reads."""
