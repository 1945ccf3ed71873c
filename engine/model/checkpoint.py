"""Strict, lazy loading of Hugging Face safetensors checkpoints (single file or sharded with an index).

The model declares every tensor it expects (`TensorSpec`: checkpoint name, full shape, kind,
loader, and the part this rank keeps). Loading walks the files with `safe_open` (memory-mapped,
one tensor at a time), checks each tensor's shape and dtype kind before reading anything, reads
only this rank's rows or columns of a split tensor, and hands them to the spec's loader, which
copies them into the already-allocated parameter. Afterwards:
- a checkpoint tensor no spec names is an error (unless it is deliberately skipped: vision
  weights of the K2.5 wrapper, multi-token-prediction layers past num_hidden_layers);
- a spec no checkpoint tensor provided is an error;
- a tensor of the wrong shape or kind is an error.
Each error names the tensor(s).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from pathlib import Path

import torch

from k2bench.engine.model.config import ModelConfig
from k2bench.engine.model.faults import apply_scale_fault
from k2bench.engine.model.parallel import TensorSpec
from k2bench.errors import UserError

INDEX_NAME = "model.safetensors.index.json"
_FLOAT_DTYPES = {"F32", "F16", "BF16", "F64"}
_BYTE_DTYPES = {"U8", "F8_E8M0"}


class CheckpointError(UserError):
    """The checkpoint does not match the model its config.json describes."""


def checkpoint_files(model_dir: str | Path) -> list[Path]:
    d = Path(model_dir)
    index = d / INDEX_NAME
    if index.is_file():
        weight_map = json.loads(index.read_text()).get("weight_map") or {}
        files = sorted({d / f for f in weight_map.values()})
        missing = [str(f) for f in files if not f.is_file()]
        if missing:
            raise CheckpointError(f"{index} names shard files that do not exist: {', '.join(missing)}")
        return files
    files = sorted(d.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"no *.safetensors files in {d}")
    return files


def _skipped(name: str, cfg: ModelConfig) -> bool:
    if any(name.startswith(p) for p in cfg.skip_prefixes):
        return True
    m = re.match(re.escape(cfg.model_prefix) + r"\.layers\.(\d+)\.", name)
    if m and int(m.group(1)) >= cfg.num_hidden_layers:  # multi-token-prediction layers: not served
        return True
    return name.endswith("rotary_emb.inv_freq")


def _summarise(names: Iterable[str], limit: int = 8) -> str:
    names = sorted(names)
    head = ", ".join(names[:limit])
    return head + (f" ... and {len(names) - limit} more" if len(names) > limit else "")


def load_checkpoint(model_dir: str | Path, specs: Iterable[TensorSpec], cfg: ModelConfig) -> None:
    from safetensors import safe_open

    by_name: dict[str, TensorSpec] = {}
    for s in specs:
        if s.name in by_name:
            raise RuntimeError(f"model declares checkpoint tensor {s.name} twice")
        by_name[s.name] = s
    seen: set[str] = set()
    unused: list[str] = []
    for path in checkpoint_files(model_dir):
        with safe_open(str(path), framework="pt", device="cpu") as fh:
            for name in fh.keys():
                spec = by_name.get(name)
                if spec is None:
                    if not _skipped(name, cfg):
                        unused.append(name)
                    continue
                if name in seen:
                    raise CheckpointError(f"tensor {name} appears in more than one shard ({path.name})")
                sl = fh.get_slice(name)
                shape, dtype = tuple(sl.get_shape()), sl.get_dtype()
                if shape != spec.shape:
                    raise CheckpointError(
                        f"tensor {name} in {path.name} has shape {list(shape)}, the config expects {list(spec.shape)}"
                    )
                allowed = _FLOAT_DTYPES if spec.kind == "float" else _BYTE_DTYPES
                if dtype not in allowed:
                    raise CheckpointError(
                        f"tensor {name} in {path.name} has dtype {dtype}, expected one of {sorted(allowed)}"
                        + (" (an MXFP4 packed weight or E8M0 scale)" if spec.kind == "uint8" else "")
                    )
                if spec.part is None:
                    t = fh.get_tensor(name)
                else:  # read only this rank's rows / columns
                    dim, start, length = spec.part
                    t = sl[start : start + length] if dim == 0 else sl[:, start : start + length]
                if spec.kind == "uint8" and t.dtype != torch.uint8:
                    t = t.view(torch.uint8)
                t = apply_scale_fault(name, t)  # no-op unless a test switches the fault on
                spec.load(t)
                seen.add(name)
    if unused:
        raise CheckpointError(f"checkpoint tensors not used by the model: {_summarise(unused)}")
    missing = set(by_name) - seen
    if missing:
        raise CheckpointError(f"checkpoint is missing tensors: {_summarise(missing)}")
