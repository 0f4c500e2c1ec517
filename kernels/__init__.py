"""Batch-invariant kernels (CPU torch, GPU Triton) and the kernel-mode switch."""
