"""What the tests share: the process harness, parity helpers, tiny configs and runs."""
