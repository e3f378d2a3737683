"""Executor side of a fit: what every rank runs inside its barrier task (the training loop,
its steps and metrics, snapshot evaluation on the ranks, resuming from checkpoints)."""
