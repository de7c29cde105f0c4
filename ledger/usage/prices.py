"""Which price applies to an account: the names prices are keyed by, and the table in force.

A price is USD per chip-hour for an accelerator family (as in `ledger.tpu_types`: v4, v5p,
v5litepod, v6e, ...) and a pricing model (as a job spec spells it: spot, ondemand,
preemptible, reserved). The table in force at a moment is the one the ledger's latest
`policy_changed` event recorded (the policy file in git, as the watcher read it), unless a
report overrides some prices (`ledger usage --price`). Nothing is assumed: a missing price
leaves a cost unknown and is named.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from typing import Any

from ledger.placement import family_of

# The stream of `policy_changed` events (the watcher writes them when the policy file changes).
POLICY_STREAM = "_policy"
Prices = Mapping[tuple[str, str], float]  # (family, pricing) -> USD per chip-hour
# (price, on-demand price, "family/pricing", "family/ondemand") of an account; None = missing
Rates = tuple[float | None, float | None, str, str]


@functools.lru_cache(maxsize=256)
def pricing_name(text: str) -> str:
    """One spelling per pricing model: 'on-demand', 'On_Demand' and 'ondemand' are one."""
    return "".join(c for c in text.lower() if c.isalnum())


def price_family(accelerator: str) -> str:
    """The family a price is looked up by: the type's (ledger.placement), else the name's
    prefix, so an unknown type's missing price is still named."""
    return family_of(accelerator) or (accelerator.rsplit("-", 1)[0] if accelerator else "?")


def normalized(prices: Prices | None) -> dict[tuple[str, str], float]:
    return {(family, pricing_name(pricing)): float(usd) for (family, pricing), usd in (prices or {}).items()}


def from_event(data: Mapping[str, Any]) -> dict[tuple[str, str], float]:
    """The table a `policy_changed` event recorded (entries of another shape are skipped)."""
    items: Iterable[Any] = data.get("prices") or ()
    table = {}
    for p in items:
        if isinstance(p, Mapping) and isinstance(p.get("usd_per_chip_hour"), int | float):
            table[str(p.get("family")), pricing_name(str(p.get("pricing")))] = float(p["usd_per_chip_hour"])
    return table


class PriceBook:
    """The prices in force: the ledger's table (replaced by each `policy_changed`) under the
    report's overrides."""

    __slots__ = ("overrides", "table", "commit", "_rates")

    def __init__(self, overrides: Prices | None = None) -> None:
        self.overrides = normalized(overrides)
        self.table: dict[tuple[str, str], float] = {}
        self.commit: str | None = None  # the policy commit the ledger's table came from
        self._rates: dict[tuple[str, str], Rates] = {}

    def replace(self, table: Mapping[tuple[str, str], float], commit: str | None = None) -> None:
        self.table, self.commit = dict(table), commit
        self._rates.clear()

    def in_force(self) -> list[dict[str, Any]]:
        """The prices in force now, as reports show them: each with where it came from."""
        merged = {key: (usd, "policy") for key, usd in self.table.items()}
        merged.update({key: (usd, "--price") for key, usd in self.overrides.items()})
        return [{"family": f, "pricing": p, "usd_per_chip_hour": usd, "from": source}
                for (f, p), (usd, source) in sorted(merged.items())]

    def rates(self, accelerator: str, pricing: str) -> Rates:
        key = (accelerator, pricing)
        found = self._rates.get(key)
        if found is None:
            family, model = price_family(accelerator), pricing_name(pricing or "ondemand")
            found = self._rates[key] = (self._rate(family, model), self._rate(family, "ondemand"),
                                        f"{family}/{model}", f"{family}/ondemand")
        return found

    def _rate(self, family: str, model: str) -> float | None:
        key = (family, model)
        return self.overrides[key] if key in self.overrides else self.table.get(key)
