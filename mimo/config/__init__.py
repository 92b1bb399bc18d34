"""Floor 0: the config tree (schema), loading it (load), checking it alone (validate)."""
