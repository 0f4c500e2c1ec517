"""A user's program as a run kind: `tttr record -- PROGRAM` (record), its replay (replay),
a fork at one site (fork, with the app's edit dialog's entry points in edit), the deltas
between two of its runs (deltas) and the experiments over them (triage), the model calls
generated live after a divergence (live), and a Responses API call's divergence in its own
terms (divergence)."""
