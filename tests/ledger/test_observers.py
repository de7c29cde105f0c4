"""Observers: every hook hears each call in order; one that raises is logged and skipped."""

from __future__ import annotations

import logging

import pytest

from ledger.observers import Observers


def test_every_hook_hears_the_call_even_after_one_raises(caplog: pytest.LogCaptureFixture) -> None:
    heard: list[tuple[str, float]] = []

    def broken(method: str, seconds: float) -> None:
        raise RuntimeError("a metrics bug")

    hooks: Observers[[str, float]] = Observers()
    hooks.append(lambda method, seconds: heard.append((method, seconds)))
    hooks.append(broken)
    hooks.append(lambda method, seconds: heard.append((method.lower(), seconds * 2)))
    with caplog.at_level(logging.ERROR, logger="tpu_ledger.observers"):
        hooks("ListNodes", 0.5)
    assert heard == [("ListNodes", 0.5), ("listnodes", 1.0)]
    assert "an observer failed" in caplog.text and "a metrics bug" in caplog.text


def test_no_hooks_is_a_quiet_call() -> None:
    Observers()("anything", 1)
