"""The type of what a click option decorator takes and gives back, for every command module
that defines one (`commands.common`, `queueview`, `observability.service`, `forgeopts`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

# A command's function, or a command already made (the bound click's own decorators use).
FC = TypeVar("FC", bound=Callable[..., Any] | click.Command)
