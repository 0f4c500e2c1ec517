"""The inference engine, the agent loop, the oracle, replay/fork/diff."""
