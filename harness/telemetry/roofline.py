"""The physical limit of a sweep: the roofline of tok/s/GPU against tok/s/user, and each level's share of it.

A decode step of `batch` sequences must, on each rank, read every weight it uses once (replicated
tensors whole, tensor-parallel ones as its slice, routed experts only if some token picked them)
and the latent KV cache of every sequence; it must also do the step's FLOPs. Its floor is the
larger of bytes / HBM bandwidth and FLOPs / tensor peak. A request's prefill costs at least its
FLOPs at peak. With `batch` requests in flight, one generation of them takes at least
batch x prefill + OSL x step, which bounds throughput per GPU; 1 / step bounds tok/s/user.
Both are upper bounds: a measured level lies below and left of its point on the curve.

Bytes come from the checkpoint's own tensors (safetensors headers; nothing is loaded); FLOPs from
the model's config (DeepSeek-V3 / Kimi-K2 layout: MLA attention, dense then MoE layers). The
hardware figures come from harness/data/hardware.toml (datasheet, with sources), or a measured
bandwidth. Used by the sweep's report and by bench/decode_roofline.py.
"""

from __future__ import annotations

import json
import re
import struct
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from k2bench.errors import UserError
from k2bench.harness import data

# Tensors split across ranks (on their output or input dim); everything else is replicated.
_SPLIT = re.compile(r"(q_b_proj|q_proj|kv_b_proj|o_proj|gate_proj|up_proj|down_proj|lm_head)\.(weight|weight_scale)$")
_EXPERT = re.compile(r"\.mlp\.experts\.(\d+)\.")
_LAYER = re.compile(r"layers\.(\d+)\.")
HARDWARE = "hardware.toml"


def tensor_bytes(model_dir: Path) -> dict[str, int]:
    """name -> stored bytes, read from the safetensors headers (8-byte length + JSON)."""
    sizes: dict[str, int] = {}
    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        raise UserError(f"no *.safetensors in {model_dir}: the roofline needs the checkpoint's tensor sizes")
    for f in files:
        with open(f, "rb") as fh:
            (n,) = struct.unpack("<Q", fh.read(8))
            header = json.loads(fh.read(n))
        for name, info in header.items():
            if name != "__metadata__":
                lo, hi = info["data_offsets"]
                sizes[name] = hi - lo
    return sizes


def _text(cfg: dict) -> dict:
    text = cfg.get("text_config", cfg)
    missing = [k for k in ("hidden_size", "num_hidden_layers", "num_attention_heads", "kv_lora_rank",
                           "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim", "vocab_size") if k not in text]
    if missing:
        raise UserError(f"the roofline needs a DeepSeek-V3-style config (MLA); missing {', '.join(missing)}")
    return text


def step_bytes(sizes: dict[str, int], cfg: dict, tp: int, batch: int, ctx: float, kv_bytes: int) -> dict[str, float]:
    """Bytes one rank must read in one decode step of `batch` sequences with mean context `ctx`."""
    text = _text(cfg)
    experts = int(text.get("n_routed_experts") or 0)
    topk = int(text.get("num_experts_per_tok") or 0)
    layers = int(text["num_hidden_layers"])
    kv_dim = int(text["kv_lora_rank"]) + int(text["qk_rope_head_dim"])
    per_expert_layer: dict[int, float] = defaultdict(float)  # layer -> bytes of all its experts on this rank
    fixed = 0.0
    for name, nbytes in sizes.items():
        share = nbytes / tp if _SPLIT.search(name) else nbytes
        if "embed_tokens" in name:
            share = nbytes / int(text["vocab_size"]) * batch  # only the rows of this step's tokens
        if _EXPERT.search(name):
            per_expert_layer[int(_LAYER.search(name).group(1))] += share
        else:
            fixed += share
    # Expected distinct experts touched when `batch` tokens each pick `topk` of `experts` (uniform routing).
    touched = experts * (1 - (1 - topk / experts) ** batch) if experts else 0.0
    expert_bytes = sum(b / experts * touched for b in per_expert_layer.values()) if experts else 0.0
    kv = batch * ctx * kv_dim * kv_bytes * layers  # the latent is not split across ranks
    return {"weights_fixed": fixed, "experts": expert_bytes, "kv": kv, "total": fixed + expert_bytes + kv,
            "experts_touched": touched}


def param_counts(cfg: dict) -> dict[str, int]:
    """Matrix parameters (norms and biases left out): all of them, and those one token uses."""
    t = _text(cfg)
    h, heads, layers = int(t["hidden_size"]), int(t["num_attention_heads"]), int(t["num_hidden_layers"])
    nope, rope, v, kv_lora = (int(t[k]) for k in ("qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim",
                                                    "kv_lora_rank"))
    q_lora = t.get("q_lora_rank")
    q = h * q_lora + q_lora * heads * (nope + rope) if q_lora else h * heads * (nope + rope)
    attn = q + h * (kv_lora + rope) + kv_lora * heads * (nope + v) + heads * v * h
    experts = int(t.get("n_routed_experts") or 0)
    dense_layers = min(layers, int(t.get("first_k_dense_replace", 0))) if experts else layers
    moe_layers = layers - dense_layers
    dense_mlp = 3 * h * int(t.get("intermediate_size") or 0)
    expert = 3 * h * int(t.get("moe_intermediate_size") or 0)
    shared = int(t.get("n_shared_experts") or 0) * expert
    topk = int(t.get("num_experts_per_tok") or 0)
    table = h * int(t["vocab_size"])  # the embedding (a lookup: no FLOPs) and lm_head, unless tied
    body = layers * attn + dense_layers * dense_mlp + moe_layers * (shared + h * experts) + table  # + lm_head
    embed = 0 if t.get("tie_word_embeddings") else table
    return {"total": body + embed + moe_layers * experts * expert, "active": body + moe_layers * topk * expert}


def flops_per_token(cfg: dict, ctx: float) -> float:
    """FLOPs of one token at context `ctx`: 2 per active weight, plus MLA attention over the latent cache."""
    t = _text(cfg)
    heads, kv_lora, rope = int(t["num_attention_heads"]), int(t["kv_lora_rank"]), int(t["qk_rope_head_dim"])
    attention = 2 * heads * ctx * (kv_lora + rope) + 2 * heads * ctx * kv_lora  # scores, then values (absorbed)
    return 2.0 * param_counts(cfg)["active"] + int(t["num_hidden_layers"]) * attention


@dataclass(frozen=True)
class Hardware:
    name: str
    hbm_gbs: float
    tflops: float  # the dtype the model computes in
    source: str


def hardware(name: str | None, dtype: str = "bf16", bandwidth_gbs: float | None = None) -> Hardware | None:
    """The table's peaks for a recorded hardware name (None if unknown); a measured bandwidth overrides."""
    hit = data.find(data.load(HARDWARE), name)
    if hit is None:
        return None
    key, entry = hit
    peaks = entry["tflops"]
    if dtype not in peaks:
        raise UserError(f"{HARDWARE} [{key}] has no {dtype} peak (it has {', '.join(sorted(peaks))})")
    bw = float(bandwidth_gbs) if bandwidth_gbs else float(entry["hbm_gbs"])
    src = entry["source"] + (f"; bandwidth measured: {bw:g} GB/s" if bandwidth_gbs else "")
    return Hardware(name=key, hbm_gbs=bw, tflops=float(peaks[dtype]), source=src)


def limit(sizes: dict[str, int], cfg: dict, hw: Hardware, *, tp: int, batch: int, isl: int, osl: int,
          kv_bytes: int = 2, num_gpus: int | None = None) -> dict:
    """The roofline point of one concurrency: step floor, prefill floor, tok/s/user and tok/s/GPU bounds."""
    gpus = num_gpus or tp
    ctx = isl + osl / 2
    b = step_bytes(sizes, cfg, tp, batch, ctx, kv_bytes)
    peak = hw.tflops * 1e12
    t_mem = b["total"] / (hw.hbm_gbs * 1e9)
    t_flop = batch * flops_per_token(cfg, ctx) / tp / peak
    step = max(t_mem, t_flop)
    prefill = isl * flops_per_token(cfg, isl / 2) / tp / peak
    cycle = batch * prefill + osl * step
    return {"concurrency": batch, "step_ms": step * 1e3, "bound": "memory" if t_mem >= t_flop else "compute",
            "bytes_per_step": b["total"], "experts_touched": b["experts_touched"], "prefill_ms": prefill * 1e3,
            "interactivity": 1.0 / step, "tput_per_gpu": batch * (isl + osl) / cycle / gpus}


def curve(sizes: dict[str, int], cfg: dict, hw: Hardware, *, tp: int, isl: int, osl: int, max_batch: int = 1024,
          kv_bytes: int = 2, num_gpus: int | None = None, extra: tuple[int, ...] = ()) -> list[dict]:
    """Roofline points at batch 1, 2, 4, ... max_batch and at the `extra` batches (a sweep's levels)."""
    batches = {1 << k for k in range(max_batch.bit_length()) if 1 << k <= max_batch} | set(extra)
    return [limit(sizes, cfg, hw, tp=tp, batch=b, isl=isl, osl=osl, kv_bytes=kv_bytes, num_gpus=num_gpus)
            for b in sorted(batches)]


def share_of_limit(point: dict, bound: dict) -> dict:
    """A measured level against the roofline at its concurrency, in percent."""
    inter = (point.get("interactivity") or {}).get("median")
    tput = point.get("tput_per_gpu")
    return {"pct_tput": 100.0 * tput / bound["tput_per_gpu"] if tput else None,
            "pct_interactivity": 100.0 * inter / bound["interactivity"] if inter else None}


def for_run(model_dir: Path | None, hardware_name: str | None, *, tp: int, isl: int, osl: int,
            levels: tuple[int, ...] = (), num_gpus: int | None = None, max_batch: int = 1024, dtype: str = "bf16",
            bandwidth_gbs: float | None = None) -> tuple[dict | None, str | None]:
    """The run's roofline ({hardware, source, dtype, points}) or (None, why not): the sweep's entry point.

    The compute peak is the dtype the model multiplies in (bf16 for weight-only quantisation such as
    the bundled engine's W4A16 path)."""
    if model_dir is None or not (Path(model_dir) / "config.json").is_file():
        return None, "roofline off: no local model folder (config.json and safetensors) to size the model"
    hw = hardware(hardware_name, dtype=dtype, bandwidth_gbs=bandwidth_gbs)
    if hw is None:
        return None, f"roofline off: {hardware_name!r} is not in {HARDWARE}"
    cfg = json.loads((Path(model_dir) / "config.json").read_text())
    points = curve(tensor_bytes(Path(model_dir)), cfg, hw, tp=tp, isl=isl, osl=osl,
                   max_batch=max(max_batch, *levels, 1), num_gpus=num_gpus, extra=tuple(levels))
    return {"hardware": hw.name, "source": hw.source, "dtype": dtype, "hbm_gbs": hw.hbm_gbs, "tflops": hw.tflops,
            "points": points}, None


def level_share(roof: dict | None, point: dict) -> dict | None:
    """A level's share of the run's roofline at its concurrency (None without one or off the curve)."""
    if not roof:
        return None
    bound = next((p for p in roof["points"] if p["concurrency"] == point.get("concurrency")), None)
    return None if bound is None else share_of_limit(point, bound)


def one_wave_stall(point: dict, osl: int) -> dict:
    """What a one-wave level's prefills cost its decodes: {} unless the level sent as many prompts as it
    had streams, all at once (the design card's levels), else ``prompt_ms``, ``stall_ms`` and ``share``.

    The model: prompts are prefilled one after another, one step of t_p each, and a stream already
    decoding gets its next token in each of those steps; once all are in, decode steps of d follow. The
    k-th prompt's first token comes at k x t_p, and its 1023 (OSL - 1) gaps hold N - k prefill steps and
    decode steps for the rest. Over the level (medians, N odd or even):

        TTFT p50 = (N + 1) / 2 x t_p
        TPOT p50 = d x (1 - share) + stall,   share = (N - 1) / 2 / (OSL - 1),   stall = share x t_p

    So t_p (``prompt_ms``, the level's own prefill speed with its decodes beside it) comes from TTFT p50,
    the decode step the level implies is d = (TPOT p50 - stall) / (1 - share), and with d at its floor f,
    f x (1 - share) + stall is the least TPOT p50 that prefill speed allows (docs/engine.md)."""
    n = point.get("concurrency") or 0
    ttft = (point.get("ttft_ms") or {}).get("median")
    if n < 1 or point.get("num_prompts") != n or point.get("mode", "closed") != "closed" or not ttft or osl < 2:
        return {}
    prompt_ms = ttft / ((n + 1) / 2)
    share = (n - 1) / 2 / (osl - 1)
    if share >= 1:  # more prefills than gaps: the model above does not hold
        return {}
    return {"prompt_ms": prompt_ms, "share": share, "stall_ms": share * prompt_ms}


def one_wave_decode_ms(tpot_ms: float, wave: dict) -> float:
    """The decode step a one-wave level implies (see one_wave_stall)."""
    return (tpot_ms - wave["stall_ms"]) / (1 - wave["share"])


def one_wave_bound_ms(floor_ms: float, wave: dict) -> float:
    """The least TPOT p50 of a one-wave level at its prefill speed, with decode steps at ``floor_ms``."""
    return floor_ms * (1 - wave["share"]) + wave["stall_ms"]
