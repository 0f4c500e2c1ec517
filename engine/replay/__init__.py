"""Record, replay, fork and diff of agent runs: the agent loop asks one oracle for every
value it could not have predicted; the oracle pins or frees each layer by the policy,
applies at most one mutation and writes the run's events to the store. Two programs drive
the oracle: the shell agent's loop (`agent.py`, entry points in `runs.py`) and the recorded
API calls of `tttr serve` (`calls.py`), each call's message obtained in turn."""
