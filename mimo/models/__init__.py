"""Floor 1: single-device model code. Nothing in here knows about process groups."""
