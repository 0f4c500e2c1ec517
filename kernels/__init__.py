"""Batch-invariant kernels (CPU torch, GPU Triton) and the kernel-mode switch."""

# Bumped whenever TTTR's own compiled kernels change the bits they produce, so a run's
# fingerprint tells a replay on a newer TTTR why its logits differ (1: compiled attention;
# 2: products from GGUF blocks, compiled row-local steps, attention with a lane-split dot).
REVISION = 2
