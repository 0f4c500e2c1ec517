"""The store's depth bound on values: a container nested deeper than the limit is named, one at
the limit is not, whatever mixes lists and objects; a decoded value is measured once."""

from tttr.sessions import values


def _nest(n, leaf=1, obj=False):
    v = leaf
    for i in range(n):
        v = {"k": v} if obj and i % 2 else [v]
    return v


def test_depth_bound_at_the_limit():
    assert values.depth_problem(_nest(values.MAX_DEPTH)) is None
    assert values.depth_problem(_nest(values.MAX_DEPTH + 1)) is not None
    assert values.depth_problem(_nest(values.MAX_DEPTH + 1, obj=True)) is not None
    assert values.depth_problem(_nest(100_000)) is not None  # no recursion
    assert values.depth_problem([1, "x", None, [], {}]) is None
    assert values.depth_problem([[1], _nest(2, leaf=[])], limit=4) is None  # an empty list at depth 4
    assert values.depth_problem([[1], _nest(3, leaf=[])], limit=4) is not None


def test_check_still_bounds_depth_of_values_from_anywhere():
    deep = {"text": "x", "extra": _nest(values.MAX_DEPTH + 1)}
    assert "levels deep" in values.check("message", deep)
    assert values.check_fields("message", deep) is None  # fields alone: decode_value's values are bounded already
    assert values.check("message", {"text": 3}) == values.check_fields("message", {"text": 3})


def test_decoded_json_too_deep_is_a_problem():
    text = "[" * (values.MAX_DEPTH + 1) + "]" * (values.MAX_DEPTH + 1)
    value, problem = values.decode_value("message", text, None, 0, None)
    assert value is None and "deep" in problem
