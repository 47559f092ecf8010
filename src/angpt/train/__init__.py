"""Training: optimizers and schedules, the training loop, checkpoints, distributed wrapping."""
