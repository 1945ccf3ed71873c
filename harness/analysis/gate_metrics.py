"""Which metrics the gate judges: one grammar for `regress`, `changepoints` and `bisect`.

``--gate-metric`` is repeatable and each value may list names separated by commas. A plain name
replaces the default set (the catalogue's gated metrics) with the plain names given; ``+NAME`` adds
a metric to whatever set the plain names left (the default one when there are none)::

    --gate-metric steady_tput_per_gpu                 only steady-state tok/s/GPU
    --gate-metric +steady_tput_per_gpu,+steady_tpot_ms_p99   the default set and two steady-state ones
    --gate-metric tput_per_gpu --gate-metric tpot_ms_p99     these two only

Any catalogue metric may be named (k2bench.harness.measure.catalogue); an unknown name is refused with
the list of valid ones. The metrics the user named are kept apart (``Selection.named``) so that one
without data in the compared runs is reported as such, while a default metric that was never measured
(J/token without GPU telemetry) stays out of the report quietly, as it always did.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from k2bench.errors import UserError
from k2bench.harness.measure.catalogue import BY_COLUMN, GATE_METRICS, Metric

DEFAULT: tuple[str, ...] = tuple(m.column for m in GATE_METRICS)
FLAG = "--gate-metric"


@dataclass(frozen=True)
class Selection:
    metrics: tuple[str, ...]  # judged, in order: the base set first, then the added ones
    named: tuple[str, ...] = ()  # the ones the user named (plain or +), in the order given

    @property
    def is_default(self) -> bool:
        return not self.named


def valid_names() -> str:
    return ", ".join(BY_COLUMN)


def check(names: Iterable[str], flag: str = FLAG) -> None:
    """Refuse names that are not catalogue metrics, listing the valid ones."""
    unknown = [n for n in names if n not in BY_COLUMN]
    if unknown:
        raise UserError(f"{flag}: {', '.join(map(repr, unknown))} not in the catalogue of metrics; "
                        f"valid: {valid_names()}")


def _items(values: Iterable[str], flag: str) -> list[str]:
    out = []
    for raw in values:
        for item in raw.split(","):
            item = item.strip()
            if not item or item == "+":
                raise UserError(f"{flag} {raw!r}: an empty metric name; expected NAME or +NAME, "
                                "comma-separated (e.g. +steady_tput_per_gpu)")
            out.append(item)
    return out


def parse(values: Iterable[str] | None, default: Iterable[str] = DEFAULT, flag: str = FLAG) -> Selection:
    """The selection that ``values`` (each one flag's text) make of ``default``."""
    items = _items(values or (), flag)
    plain = [i for i in items if not i.startswith("+")]
    added = [i[1:].strip() for i in items if i.startswith("+")]
    check(plain + added, flag)
    base = plain or list(default)
    metrics = list(dict.fromkeys(base + added))
    return Selection(tuple(metrics), tuple(dict.fromkeys(i.lstrip("+").strip() for i in items)))


def one(value: str, flag: str = "--metric") -> Metric:
    """The single metric a bisection decides on: any catalogue metric, named plainly."""
    items = _items([value], flag)
    if len(items) != 1 or items[0].startswith("+"):
        raise UserError(f"{flag} {value!r}: bisect decides on one metric; name exactly one, without '+' "
                        "(e.g. steady_tput_per_gpu)")
    check(items, flag)
    return BY_COLUMN[items[0]]


def metrics_of(names: Iterable[str]) -> tuple[Metric, ...]:
    return tuple(BY_COLUMN[n] for n in names)
