"""Workload definitions: TOML files in defs/ (or a path), validated into a `Workload`.

A workload says what each request asks for (input and output lengths, their spread, token ids or
text, the seed); the prompts it produces are built in `k2bench.workloads.prompts`.

Range ratio works as in InferenceX's client: each request's input and output lengths are drawn
uniformly from [floor(L x ratio), L]; 1.0 means exact lengths.

Beyond random token ids (the default, InferenceX's method) a workload may take its content from a local
dataset file (``source``: jsonl, sharegpt, text), share a prefix between the prompts of a group
(``prefix_len``, ``prefix_groups``), hold conversations of several turns (``turns``, ``think_time_s``), or
replay a Mooncake-format trace (``--trace``). docs/workloads.md describes every key.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, fields, replace
from importlib import resources
from pathlib import Path

from k2bench.errors import UserError

try:
    import tomllib
except ModuleNotFoundError:  # pragma: no cover - Python 3.10
    import tomli as tomllib

DEFAULT_TOKEN_RANGE = (1000, 30000)
DEFAULT = "8k1k"  # the workload of a sweep that names none (InferenceX's headline 8k/1k)
MODES = ("tokens", "text")
SOURCES = ("random", "jsonl", "sharegpt", "text", "trace")  # trace: only through --trace (loader.for_trace)
LENGTHS = ("fixed", "uniform", "dataset")
TRACE_BLOCK = 512  # tokens per hash id in Mooncake's traces
_KEYS = {"name", "description", "isl", "osl", "range_ratio", "mode", "seed", "token_id_range", "source", "path",
         "prompt_field", "output_field", "lengths", "prefix_len", "prefix_groups", "turns", "think_time_s"}


@dataclass(frozen=True)
class Workload:
    name: str
    isl: int
    osl: int
    range_ratio: float = 1.0
    mode: str = "tokens"
    seed: int = 0
    token_id_range: tuple[int, int] = DEFAULT_TOKEN_RANGE
    description: str = ""
    source: str = "random"
    path: str | None = None  # the dataset (or trace) file, resolved against the definition's folder
    prompt_field: str = "prompt"  # jsonl: the field holding the prompt text
    output_field: str | None = None  # jsonl: a field holding the output length (lengths = "dataset")
    lengths: str = ""  # fixed | uniform | dataset; "" picks fixed or uniform from range_ratio
    prefix_len: int = 0  # tokens shared by the prompts of a group (part of isl)
    prefix_groups: int = 1
    turns: int = 1  # > 1: conversations, each turn sending the whole history
    think_time_s: float = 0.0  # pause between a turn's answer and the next turn
    block_size: int = TRACE_BLOCK  # trace: tokens per hash id
    time_scale: float = 1.0  # trace: multiply the trace's gaps by this

    def __post_init__(self) -> None:
        where = f"workload {self.name!r}"
        for key in ("isl", "osl"):
            v = getattr(self, key)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise UserError(f"{where}: {key} must be a whole number >= 1, got {v!r}")
        if not self.lengths:
            object.__setattr__(self, "lengths", "fixed" if self.range_ratio >= 1 else "uniform")
        if self.source not in SOURCES:
            raise UserError(f"{where}: source must be one of {', '.join(SOURCES[:-1])}, got {self.source!r}")
        if self.source != "random" and not self.path:
            raise UserError(f"{where}: source {self.source!r} needs path = the dataset file")
        if self.lengths not in LENGTHS:
            raise UserError(f"{where}: lengths must be one of {', '.join(LENGTHS)}, got {self.lengths!r}")
        if self.lengths == "dataset" and self.source in ("random", "text"):
            raise UserError(f"{where}: lengths = 'dataset' needs a jsonl or sharegpt source (it has lengths)")
        if (self.lengths == "uniform") != (self.range_ratio < 1):
            raise UserError(f"{where}: lengths = 'uniform' goes with a range_ratio below 1 (and only then)")
        for key, low in (("prefix_len", 0), ("prefix_groups", 1), ("turns", 1), ("block_size", 1)):
            v = getattr(self, key)
            if isinstance(v, bool) or not isinstance(v, int) or v < low:
                raise UserError(f"{where}: {key} must be a whole number >= {low}, got {v!r}")
        if self.prefix_len and (self.prefix_len >= self.isl * self.range_ratio or self.source != "random"):
            raise UserError(f"{where}: prefix_len must be below the shortest input length (isl x range_ratio) "
                            f"of a random-source workload")
        if self.turns > 1 and self.mode != "text":
            raise UserError(f"{where}: conversations (turns > 1) send the history as chat messages: set "
                            f"mode = 'text'")
        if self.source == "trace" and self.mode != "tokens":
            raise UserError(f"{where}: a trace is replayed as token ids (mode = 'tokens')")
        if self.turns > 1 and self.prefix_len:
            raise UserError(f"{where}: give either turns or prefix_len (a conversation shares its own history)")
        if not (self.think_time_s >= 0 and self.time_scale > 0):
            raise UserError(f"{where}: think_time_s must be >= 0 and time_scale > 0")
        if not (0 < self.range_ratio <= 1):
            raise UserError(f"workload {self.name!r}: range_ratio must be in (0, 1], got {self.range_ratio!r}")
        if self.mode not in MODES:
            raise UserError(f"workload {self.name!r}: mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        lo, hi = self.token_id_range
        if not (0 <= lo < hi):
            raise UserError(f"workload {self.name!r}: token_id_range must be [lo, hi) with 0 <= lo < hi")

    def with_lengths(self, isl: int | None, osl: int | None) -> Workload:
        """This workload with ISL/OSL overridden (the name says so when they differ)."""
        if (isl is None or isl == self.isl) and (osl is None or osl == self.osl):
            return self
        new_isl = self.isl if isl is None else isl  # 0 is a value (refused by the Workload), not "not given"
        new_osl = self.osl if osl is None else osl
        return replace(self, name=f"{self.name}@isl{new_isl}-osl{new_osl}", isl=new_isl, osl=new_osl)

    @property
    def is_classic(self) -> bool:
        """Random token ids of fixed or uniform lengths, one prompt per request: what every workload was
        before datasets, prefixes, conversations and traces (its name, lengths and ratio describe it)."""
        return self.source == "random" and not self.prefix_len and self.turns == 1

    def definition(self) -> dict | None:
        """What the run records and fingerprints beyond name, lengths and ratio (None for a classic
        workload, so that its fingerprint is what it always was)."""
        if self.is_classic:
            return None
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("name", "description")}
        out["token_id_range"] = list(self.token_id_range)
        if self.path:
            out["path"] = Path(self.path).name  # where the file lay is not part of what was measured
            out["file_sha256"] = _sha256(self.path)
        return out


def defs_dir() -> Path:
    return Path(str(resources.files("k2bench.workloads") / "defs"))


def available() -> list[str]:
    return sorted(p.stem for p in defs_dir().glob("*.toml"))


def _sha256(path: str) -> str | None:
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]
    except OSError:
        return None


_INTS = ("prefix_len", "prefix_groups", "turns", "seed")


def parse(doc: dict, where: str, folder: Path | None = None) -> Workload:
    """A definition's keys, checked; a relative ``path`` is read against ``folder`` (the TOML file's)."""
    unknown = set(doc) - _KEYS
    if unknown:
        raise UserError(f"{where}: unknown key(s) {', '.join(sorted(unknown))}; known: {', '.join(sorted(_KEYS))}")
    missing = {"name", "isl", "osl"} - set(doc)
    if missing:
        raise UserError(f"{where}: missing key(s) {', '.join(sorted(missing))}")
    rng = doc.get("token_id_range", DEFAULT_TOKEN_RANGE)
    if not (isinstance(rng, (list, tuple)) and len(rng) == 2 and all(isinstance(x, int) for x in rng)):
        raise UserError(f"{where}: token_id_range must be two whole numbers [lo, hi)")
    try:
        ratio = float(doc.get("range_ratio", 1.0))
    except (TypeError, ValueError):
        raise UserError(f"{where}: range_ratio must be a number") from None
    for key in _INTS:
        if key in doc and (isinstance(doc[key], bool) or not isinstance(doc[key], int)):
            raise UserError(f"{where}: {key} must be a whole number, got {doc[key]!r}")
    path = doc.get("path")
    if path is not None:
        if not isinstance(path, str):
            raise UserError(f"{where}: path must be a file name")
        if folder is not None and not Path(path).is_absolute() and not Path(path).exists():
            path = str(folder / path)
        if not Path(path).is_file():
            raise UserError(f"{where}: dataset file {path} does not exist (nothing is downloaded at run time; "
                            f"docs/workloads.md says where to get the common datasets)")
    try:
        think = float(doc.get("think_time_s", 0.0))
    except (TypeError, ValueError):
        raise UserError(f"{where}: think_time_s must be a number") from None
    return Workload(name=str(doc["name"]), isl=doc["isl"], osl=doc["osl"], range_ratio=ratio,
                    mode=str(doc.get("mode", "tokens")), seed=int(doc.get("seed", 0)),
                    token_id_range=(rng[0], rng[1]), description=str(doc.get("description", "")),
                    source=str(doc.get("source", "random")), path=path,
                    prompt_field=str(doc.get("prompt_field", "prompt")),
                    output_field=None if doc.get("output_field") is None else str(doc["output_field"]),
                    lengths=str(doc.get("lengths", "")), prefix_len=doc.get("prefix_len", 0),
                    prefix_groups=doc.get("prefix_groups", 1), turns=doc.get("turns", 1), think_time_s=think)


def load(name_or_path: str) -> Workload:
    """A workload by name (defs/NAME.toml) or by path to a TOML file."""
    path = Path(name_or_path)
    if not (path.suffix == ".toml" and path.exists()):
        path = defs_dir() / f"{name_or_path}.toml"
        if not path.exists():
            raise UserError(f"unknown workload {name_or_path!r}; known: {', '.join(available())} "
                            f"(or give a path to a .toml file)")
    try:
        doc = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise UserError(f"cannot read workload {path}: {exc}") from None
    return parse(doc, str(path), path.parent)


def for_trace(path: str, time_scale: float = 1.0, seed: int = 0) -> Workload:
    """The workload of ``--trace FILE``: the trace's requests, lengths and send times (checked as it is read)."""
    from k2bench.workloads.trace import read_trace

    rows = read_trace(path)
    isl = max(1, round(sum(r.input_length for r in rows) / len(rows)))
    osl = max(1, round(sum(r.output_length for r in rows) / len(rows)))
    return Workload(name=f"trace:{Path(path).stem}", isl=isl, osl=osl, source="trace", path=str(path), seed=seed,
                    lengths="dataset", time_scale=time_scale,
                    description=f"replay of {len(rows)} requests of {Path(path).name} (isl/osl: their means)")


def resolve(name: str | None, isl: int | None, osl: int | None, trace: str | None = None,
            time_scale: float | None = None) -> Workload:
    """The workload a sweep runs: --trace, else --workload (with --isl/--osl overriding), else the definition
    whose lengths match --isl/--osl exactly, else an ad-hoc exact-length one; DEFAULT when nothing is given."""
    if trace:
        if name or isl is not None or osl is not None:
            raise UserError("--trace gives the requests and their lengths: leave out --workload, --isl and --osl")
        return for_trace(trace, 1.0 if time_scale is None else time_scale)
    if time_scale is not None:
        raise UserError("--trace-time-scale applies to --trace only")
    if name:
        return load(name).with_lengths(isl, osl)
    if isl is None and osl is None:
        return load(DEFAULT)
    base = load(DEFAULT)
    isl = base.isl if isl is None else isl
    osl = base.osl if osl is None else osl
    for known in available():
        w = load(known)
        if w.is_classic and (w.isl, w.osl, w.range_ratio, w.mode) == (isl, osl, 1.0, "tokens"):
            return w
    return Workload(name=f"isl{isl}-osl{osl}", isl=isl, osl=osl, description="exact lengths (from --isl/--osl)")
