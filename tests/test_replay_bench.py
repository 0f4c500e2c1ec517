"""`tttr bench replay`'s fork floor: the sequences a fork makes are captured while it runs and the
runtime is left as it was (a unit test of the capture alone; the bench itself loads the model)."""

from tttr.engine.bench.replay import _capturing_sequences


class _Runtime:
    def sequence_factory(self, sampling):
        return lambda *args: ("seq", sampling, args)


def test_sequences_made_during_a_fork_are_captured_then_the_factory_restored():
    rt = _Runtime()
    with _capturing_sequences(rt) as made:
        make = rt.sequence_factory("greedy")
        assert make([1, 2, 3], 7, 5, 0, 64, ("```",)) == ("seq", "greedy", ([1, 2, 3], 7, 5, 0, 64, ("```",)))
    assert len(made) == 1
    again, args = made[0]
    assert again(*args) == ("seq", "greedy", ([1, 2, 3], 7, 5, 0, 64, ("```",)))
    assert "sequence_factory" not in vars(rt)  # the class's own method again
