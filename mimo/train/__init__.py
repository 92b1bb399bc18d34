"""Floor 8: the one trainer, its optimizers, precision, faults, metrics and checkpoints."""
