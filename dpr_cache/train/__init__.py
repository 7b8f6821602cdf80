"""Training: the entry point and its loop, the trainer and its update, the log, checkpoints,
the automatic chunk size, ``verify`` and ``bench``."""
