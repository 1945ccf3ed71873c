"""Workload definitions: TOML files in defs/ (or a path), validated into a `Workload`.

A workload says what each request asks for (input and output lengths, their spread, token ids or
text, the seed); the prompts it produces are built in `k2bench.workloads.prompts`.

Range ratio works as in InferenceX's client: each request's input and output lengths are drawn
uniformly from [floor(L x ratio), L]; 1.0 means exact lengths.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
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
_KEYS = {"name", "description", "isl", "osl", "range_ratio", "mode", "seed", "token_id_range"}


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

    def __post_init__(self) -> None:
        for key in ("isl", "osl"):
            v = getattr(self, key)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise UserError(f"workload {self.name!r}: {key} must be a whole number >= 1, got {v!r}")
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


def defs_dir() -> Path:
    return Path(str(resources.files("k2bench.workloads") / "defs"))


def available() -> list[str]:
    return sorted(p.stem for p in defs_dir().glob("*.toml"))


def parse(doc: dict, where: str) -> Workload:
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
    return Workload(name=str(doc["name"]), isl=doc["isl"], osl=doc["osl"], range_ratio=ratio,
                    mode=str(doc.get("mode", "tokens")), seed=int(doc.get("seed", 0)),
                    token_id_range=(rng[0], rng[1]), description=str(doc.get("description", "")))


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
    return parse(doc, str(path))


def resolve(name: str | None, isl: int | None, osl: int | None) -> Workload:
    """The workload a sweep runs: --workload (with --isl/--osl overriding), else the definition
    whose lengths match --isl/--osl exactly, else an ad-hoc exact-length one; DEFAULT when nothing is given."""
    if name:
        return load(name).with_lengths(isl, osl)
    if isl is None and osl is None:
        return load(DEFAULT)
    base = load(DEFAULT)
    isl = base.isl if isl is None else isl
    osl = base.osl if osl is None else osl
    for known in available():
        w = load(known)
        if (w.isl, w.osl, w.range_ratio, w.mode) == (isl, osl, 1.0, "tokens"):
            return w
    return Workload(name=f"isl{isl}-osl{osl}", isl=isl, osl=osl, description="exact lengths (from --isl/--osl)")
