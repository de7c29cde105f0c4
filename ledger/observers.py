"""Hooks told that something happened (a pass ended, an API call returned, an SSH command
failed): the metrics listen here. One type for every such list, so that each is called the
same way: a hook that raises is logged and skipped, never failing the work it observes nor
keeping the other hooks from hearing it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Generic, ParamSpec

P = ParamSpec("P")
log = logging.getLogger("tpu_ledger.observers")


class Observers(list[Callable[P, None]], Generic[P]):
    """A list of hooks; calling it calls each hook in turn with the same arguments."""

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> None:
        for hook in self:
            try:
                hook(*args, **kwargs)
            except Exception:  # noqa: BLE001 - an observer's bug must not fail what it observes
                log.exception("an observer failed: %r", hook)
