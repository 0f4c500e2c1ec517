"""Command-line subcommands, one module per area. Each module exposes register(sub, bench_sub)."""
