"""Training: loss, optimizers, checkpoints, metrics and the step loop."""
