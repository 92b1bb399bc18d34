"""Tests marked gpu: run on the GPU machine, skipped elsewhere."""
