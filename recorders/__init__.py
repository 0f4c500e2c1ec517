"""The trace layer's recorder: the sandboxed executor (bubblewrap, launcher, seccomp,
limits), the virtual clock and seeded randomness it runs commands under, the shell state
carried between commands, snapshots of the task tree, and the task suite."""
