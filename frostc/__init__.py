"""frostc: a plan compiler for scaled-dot-product attention on NVIDIA GPUs."""
