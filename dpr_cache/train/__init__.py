"""Training: the loop, checkpoints, the automatic chunk size, and ``verify``."""
