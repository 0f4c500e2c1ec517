"""The kernel-mode switch: one place, restores on exception, nests, never prints."""

import threading

import pytest

from tttr.kernels.mode import MODES, KernelModeError, get_mode, kernel_mode, set_mode


def test_default_is_fast():
    assert get_mode() == "fast"
    assert MODES == ("fast", "invariant", "invariant-q8")


def test_restores_on_exception():
    before = get_mode()
    with pytest.raises(RuntimeError):
        with kernel_mode("invariant"):
            assert get_mode() == "invariant"
            raise RuntimeError("boom")
    assert get_mode() == before


def test_nests():
    with kernel_mode("invariant"):
        with kernel_mode("fast"):
            assert get_mode() == "fast"
            with kernel_mode("invariant"):
                assert get_mode() == "invariant"
            assert get_mode() == "fast"
        assert get_mode() == "invariant"
    assert get_mode() == "fast"


def test_restores_after_set_mode_inside_block():
    with kernel_mode("fast"):
        set_mode("invariant")
        assert get_mode() == "invariant"
    assert get_mode() == "fast"  # the block's exit undoes the set_mode inside it
    set_mode("invariant")
    try:
        with kernel_mode("fast"):
            pass
        assert get_mode() == "invariant"
    finally:
        set_mode("fast")


def test_never_prints(capsys):
    with kernel_mode("invariant"):
        with kernel_mode("fast"):
            pass
    with pytest.raises(KernelModeError):
        with kernel_mode("fastest"):
            pass
    out = capsys.readouterr()
    assert out.out == "" and out.err == ""


def test_unknown_mode_names_the_value():
    with pytest.raises(KernelModeError, match="'turbo'") as exc:
        set_mode("turbo")
    assert exc.value.exit_code == 2
    assert get_mode() == "fast"


def test_does_not_leak_into_other_threads():
    seen = []
    with kernel_mode("invariant"):
        t = threading.Thread(target=lambda: seen.append(get_mode()))
        t.start()
        t.join()
    assert seen == ["fast"]
