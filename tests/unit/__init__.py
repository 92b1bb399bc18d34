"""Single-process tests."""
