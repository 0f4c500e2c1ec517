"""Inference: a Llama-family decoder on TTTR's kernels, loaded from GGUF or a Hugging Face
folder, batched by a scheduler whose kernel mode decides whether a row's arithmetic
depends on its neighbours. Nothing here knows about runs, sessions or agents."""
