"""The arithmetic: batch-invariant kernels (CPU: torch plus compiled C row kernels and
quantized-block GEMV; GPU: Triton) and the kernel-mode switch.

The engine reaches them through `ops` (the operations the model, sampler and scheduler
call; each picks its compiled or PyTorch path) and `mode` (fast | invariant | invariant-q8); the
rest (`crow`, `cquant`, `cq8`, `cattention`, `invariant`, `triton_kernels`, `packing`) are behind them.
"""

# Bumped whenever TTTR's own compiled kernels change the bits they produce, so a run's
# fingerprint tells a replay on a newer TTTR why its logits differ (1: compiled attention;
# 2: products from GGUF blocks, compiled row-local steps, attention with a lane-split dot;
# 3: products from Q4_K/Q5_K/Q6_K/Q5_0 blocks, which ran dense before: new bits for those files;
# 4: the invariant mode's CPU softmax and log-softmax compiled (kernels.crow): the same logits,
# other logprobs, and rarely another sampled token).
REVISION = 4
