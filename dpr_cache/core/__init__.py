"""The exact core, torch only: the contrastive loss (full and tiled), the distillation losses, the
GradCache engine, the full-batch and accumulation baselines, the cross-rank gather and the step
objects built on them. Nothing here imports transformers, the config or anything above this
package."""
