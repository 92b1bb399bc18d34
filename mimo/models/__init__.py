"""Single-device model code. Nothing in here knows about process groups."""
