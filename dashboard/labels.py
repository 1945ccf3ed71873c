"""Short configuration labels for legends, tables and pickers.

A stored configuration label names every field (engine, version, model, precision, hardware,
devices, TP, workload) and can run past 100 characters, with a CPU model string in the middle.
What a reader needs in a legend is what tells the shown configurations apart, so the fields that
differ come first, the ones they share are said once elsewhere, and long values are shortened only
while the shortened values still tell the configurations apart.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

# the parts of a label, in label order; "engine" includes engine_version, "hardware" num_gpus
PARTS = ("engine", "workload", "model", "precision", "hardware", "tp")
SEP = " · "

# vendor decorations that make CPU names long without telling two machines apart
_CPU_NOISE = (r"\((?:R|TM)\)", r"\bCPU\b", r"\bProcessor\b", r"@\s*[\d.]+\s*GHz", r"\b\d+-Core\b")


def _present(value) -> bool:
    return value is not None and not (isinstance(value, float) and np.isnan(value)) and str(value) != ""


def short_hardware(name: str) -> str:
    """'Intel(R) Xeon(R) Platinum 8480C Processor @ 2.00GHz' -> 'Intel Xeon Platinum 8480C'."""
    out = name
    for pattern in _CPU_NOISE:
        out = re.sub(pattern, " ", out)
    out = re.sub(r"\s+", " ", out).strip()
    return out or name


def short_model(name: str) -> str:
    """A model's last path component: 'amd/Kimi-K2.5-MXFP4' -> 'Kimi-K2.5-MXFP4'."""
    return name.rstrip("/").rsplit("/", 1)[-1] or name


def _part_text(part: str, row: dict, short: bool) -> str | None:
    if part == "engine":
        if not _present(row.get("engine")):
            return None
        version = row.get("engine_version")
        return f"{row['engine']} {version}" if _present(version) else str(row["engine"])
    if part == "hardware":
        hw = row.get("hardware")
        if not _present(hw):
            return None
        text = short_hardware(str(hw)) if short else str(hw)
        n = row.get("num_gpus")
        return f"{text} ×{int(n)}" if _present(n) and int(n) > 1 else text
    if part == "tp":
        return f"TP{int(row['tp'])}" if _present(row.get("tp")) else None
    value = row.get(part)
    if not _present(value):
        return None
    return short_model(str(value)) if part == "model" and short else str(value)


def _texts(rows: list[dict], part: str) -> list[str | None]:
    """Each row's text for one part: shortened, unless shortening merges two different values."""
    full = [_part_text(part, r, short=False) for r in rows]
    short = [_part_text(part, r, short=True) for r in rows]
    pairs = set(zip(full, short, strict=True))
    if len({s for _, s in pairs}) < len({f for f, _ in pairs}):
        return full
    return short


def short_labels(configs: pd.DataFrame, key: str = "config") -> tuple[dict[str, str], str]:
    """Label per ``key`` value (the parts that differ, in PARTS order) and the text of what all share.

    When nothing a part shows differs (one configuration, say), each label is every part and the
    shared text is empty. Two configurations that differ only in something no part shows (engine
    flags, say) keep apart by their fingerprint's first characters."""
    rows = configs.drop_duplicates(key).to_dict("records")
    if not rows:
        return {}, ""
    texts = {part: _texts(rows, part) for part in PARTS}
    differing = [part for part in PARTS if len(set(texts[part])) > 1]
    shown = differing or list(PARTS)
    labels = [SEP.join(t for t in (texts[p][i] for p in shown) if t) for i in range(len(rows))]
    counts = pd.Series(labels).value_counts()
    for i, row in enumerate(rows):
        if counts[labels[i]] > 1 and _present(row.get("fingerprint")):
            labels[i] = f"{labels[i]} [{str(row['fingerprint'])[:6]}]".strip()
    shared = SEP.join(t for t in (texts[p][0] for p in PARTS if p not in shown) if t)
    return {str(r[key]): lab for r, lab in zip(rows, labels, strict=True)}, shared
