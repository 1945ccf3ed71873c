"""Train the tiny Kimi-K2-shaped model on a shipped task, so the bundled model can be right or wrong.

A random tiny model makes every accuracy figure meaningless; a trained one turns a numerical bug in
the MXFP4 path into a visible accuracy drop. The model is HF transformers' DeepseekV3ForCausalLM
(MLA, sigmoid+bias group-limited MoE router, shared expert, dense first layer: the architecture the
engine is checked against in tests/engine/model/test_model_hf_equivalence.py), built from the very
config.json that `write_tiny_checkpoint` writes, trained in float32 on CPU, then exported through
the same writer: its tokenizer and config, its MXFP4 packer, its shard writer.

Quantisation-aware training: after a float warm-up, every linear the checkpoint stores in MXFP4
(dense MLP, routed and shared experts) sees its weights and its inputs quantised-dequantised per 32
along K (the engine's A4W4 numerics), with straight-through gradients, so the exported model keeps
its accuracy both in W4 and A4W4.
"""

from __future__ import annotations

import hashlib
import json
import random
import shutil
import tempfile
import time
import types
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from k2bench.engine.model.mxfp4 import fake_quantize_mxfp4
from k2bench.engine.model.tiny import TinySpec, quantize_state, save_sharded, write_tiny_checkpoint
from k2bench.workloads.tasks import load_items, task_file

TASKS = ("tiny-arith",)
# Bumped whenever the trainer or the exporter changes what a given TrainSpec produces, so that a model
# cached under an older version is trained again rather than reused (see `training_key`).
TRAINER_VERSION = 2


@dataclass(frozen=True)
class TrainSpec:
    """One place for the trainer's defaults (the CLI reads these)."""

    # 1500 steps of 48 sums (72k sequences, about 7.6 passes over the 9,500 training sums): on seed 0 the
    # carry is learnt exactly (held-out 0.994 served in W4 and A4W4), where 1200 steps of 64 (about the same
    # sums) stalled at 0.95-0.97 with the tens digit one off after a carry
    steps: int = 1500
    batch: int = 48
    lr: float = 3e-3
    warmup: float = 0.05  # fraction of steps with a linearly rising learning rate
    qat_from: float = 0.6  # fraction of steps after which weights and activations are fake-quantised
    # Smaller than the generator's default (4 layers, 16 experts of 128, top 4) so that training fits in
    # minutes on two cores: the dense first layer, then one MoE layer of 8 experts of 64, top 2 (4 groups
    # of 2, the best 2 groups), with the shared expert.
    layers: int = 2
    experts: int = 8
    experts_per_tok: int = 2
    moe_intermediate: int = 64
    seed: int = 0
    # one thread: the float reductions (and so the weights) do not depend on the machine, and on a busy
    # machine one thread is several times faster than two that spin-wait on each other
    threads: int = 1
    weight_decay: float = 0.01


def _ste(x: torch.Tensor) -> torch.Tensor:
    """MXFP4 quantise-dequantise forward, identity backward."""
    return x + (fake_quantize_mxfp4(x.detach()) - x).detach()


class _Qat:
    """A switch shared by the patched modules: off during the float warm-up, on afterwards."""

    on = False


def _patch_linear(lin: torch.nn.Linear, qat: _Qat) -> None:
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not qat.on:
            return F.linear(x, self.weight)
        return F.linear(_ste(x), _ste(self.weight))

    lin.forward = types.MethodType(forward, lin)


def _patch_experts(experts: torch.nn.Module, qat: _Qat) -> None:
    """HF's experts computed densely (every expert on every token, weighted 0 where not routed).

    Same values and gradients as HF's per-expert loop, but a few large matmuls instead of many small
    gathers, which is several times faster on CPU at this size. A4W4 numerics as in the engine: the
    input quantised once for all experts, the down projection's input again.
    """

    def forward(self, hidden: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor) -> torch.Tensor:
        q = _ste if qat.on else (lambda t: t)
        dense = torch.zeros(hidden.shape[0], self.num_experts, dtype=hidden.dtype, device=hidden.device)
        dense = dense.scatter(1, top_k_index, top_k_weights.to(hidden.dtype))  # [T, E]
        gate, up = torch.einsum("th,eih->eti", q(hidden), q(self.gate_up_proj)).chunk(2, dim=-1)
        h = torch.einsum("eti,ehi->eth", q(self.act_fn(gate) * up), q(self.down_proj))  # [E, T, H]
        return torch.einsum("eth,te->th", h, dense)

    experts.forward = types.MethodType(forward, experts)


def _kept_in_bf16(name: str) -> bool:
    """The checkpoint's exclude list (lm_head, attention, the router), matched as Quark matches it.

    By whole name, not substring: the dense layer's `mlp.gate_proj` is MXFP4 in the checkpoint even
    though its name starts like the router's `mlp.gate`.
    """
    return name.endswith("lm_head") or ".self_attn." in name or name.endswith("mlp.gate")


def build_model(config: dict, qat: _Qat):
    """DeepseekV3ForCausalLM in float32 from the engine's config.json, with QAT hooks on the MXFP4 linears."""
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    cfg = {k: v for k, v in config.items() if k not in ("quantization_config", "architectures", "torch_dtype")}
    hf = DeepseekV3Config.from_dict(cfg)
    hf._attn_implementation = "eager"
    model = DeepseekV3ForCausalLM(hf).float()
    for name, mod in model.named_modules():
        if isinstance(mod, torch.nn.Linear) and not _kept_in_bf16(name):
            _patch_linear(mod, qat)
        elif name.endswith("mlp.experts"):
            _patch_experts(mod, qat)
    return model


class _Encoder:
    """Task items -> token ids: the prompt as the question, the target as answer + newline + eos."""

    def __init__(self, tokenizer, eos: int, pad: int) -> None:
        self.tok, self.eos, self.pad = tokenizer, eos, pad

    def pair(self, item: dict) -> tuple[list[int], list[int]]:
        return self.tok.encode(item["question"]).ids, self.tok.encode(item["answer"] + "\n").ids + [self.eos]

    def batch(self, items: list[dict]) -> tuple[torch.Tensor, torch.Tensor]:
        pairs = [self.pair(it) for it in items]
        width = max(len(p) + len(a) for p, a in pairs)
        ids = torch.full((len(items), width), self.pad)
        labels = torch.full((len(items), width), -100)
        for i, (p, a) in enumerate(pairs):
            ids[i, : len(p) + len(a)] = torch.tensor(p + a)
            labels[i, len(p) : len(p) + len(a)] = torch.tensor(a)
        return ids, labels


@torch.no_grad()
def greedy_accuracy(model, enc: _Encoder, items: list[dict], max_new: int = 6) -> float:
    """Exact match of greedy answers (up to the newline), prompts of one length batched together."""
    by_len: dict[int, list[tuple[list[int], str]]] = {}
    for it in items:
        p, _ = enc.pair(it)
        by_len.setdefault(len(p), []).append((p, it["answer"]))
    right = 0
    for group in by_len.values():
        ids = torch.tensor([p for p, _ in group])
        for _ in range(max_new):
            nxt = model(input_ids=ids).logits[:, -1].argmax(-1, keepdim=True)
            ids = torch.cat([ids, nxt], dim=1)
        for row, (p, answer) in zip(ids.tolist(), group, strict=True):
            text = enc.tok.decode(row[len(p):], skip_special_tokens=False)
            right += text.split("\n")[0] == answer
    return right / len(items)


def train(model, enc: _Encoder, items: list[dict], spec: TrainSpec, qat: _Qat,
          log: Callable[[str], None] | None = None) -> float:
    """AdamW with linear warm-up and cosine decay on the answer tokens; returns the last loss."""
    rng = random.Random(spec.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=spec.lr, weight_decay=spec.weight_decay, betas=(0.9, 0.98))
    warm = max(1, int(spec.warmup * spec.steps))

    def lr_at(step: int) -> float:
        if step < warm:
            return (step + 1) / warm
        return 0.5 * (1 + torch.cos(torch.tensor(torch.pi * (step - warm) / max(1, spec.steps - warm))).item())

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_at)
    model.train()
    loss = torch.tensor(float("nan"))
    start = time.perf_counter()
    for step in range(spec.steps):
        qat.on = step >= spec.qat_from * spec.steps
        ids, labels = enc.batch([items[rng.randrange(len(items))] for _ in range(spec.batch)])
        # logits only where an answer token is predicted: the prompt positions carry no loss
        hidden = model.model(input_ids=ids).last_hidden_state[:, :-1]
        target = labels[:, 1:]
        scored = target != -100
        loss = F.cross_entropy(model.lm_head(hidden[scored]), target[scored])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if log and (step % 50 == 0 or step == spec.steps - 1):
            log(f"step {step:4d}  loss {loss.item():.4f}  qat {'on' if qat.on else 'off'}  "
                f"{time.perf_counter() - start:.0f} s")
    model.eval()
    return float(loss.item())


def export(model, out: Path, config: dict) -> None:
    """Replace the generator's random shards with the trained weights, packed by the same MXFP4 writer."""
    from safetensors.torch import load_file

    from k2bench.engine.model.config import parse_config

    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp)  # HF's own names, per-expert tensors as in the real checkpoints
        state: dict[str, torch.Tensor] = {}
        for f in sorted(Path(tmp).glob("*.safetensors")):
            state.update(load_file(str(f)))
    state = quantize_state({k: v.float() for k, v in state.items()}, parse_config(config).quant.is_quantized)
    state = {k: v.to(torch.bfloat16) if v.is_floating_point() and "e_score_correction_bias" not in k else v
             for k, v in state.items()}
    for old in out.glob("*.safetensors"):
        old.unlink()
    save_sharded(state, out, 2)


def training_key(task: str, spec: TrainSpec) -> str:
    """What a trained model depends on: the trainer's version, its spec and the task's training data."""
    data = hashlib.sha256(task_file(task, "train").read_bytes()).hexdigest()
    doc = {"version": TRAINER_VERSION, "task": task, "spec": asdict(spec), "train_data": data}
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:16]


def cached_model(out_dir: str | Path, task: str = "tiny-arith", spec: TrainSpec | None = None,
                 log: Callable[[str], None] | None = None) -> tuple[Path, bool]:
    """`out_dir` as a cache: reused when its training.json has this spec's key, else trained again.

    Training goes to a sibling folder that replaces `out_dir` only when complete, so an interrupted
    run never leaves a half-written model behind. Returns (folder, whether it was trained now).
    """
    out = Path(out_dir)
    spec = spec or TrainSpec()
    key = training_key(task, spec)
    try:
        if json.loads((out / "training.json").read_text()).get("key") == key:
            return out, False
    except (OSError, ValueError):
        pass
    tmp = out.with_name(out.name + ".training")
    shutil.rmtree(tmp, ignore_errors=True)
    train_tiny(tmp, task, spec, log)
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out, True


def train_tiny(out_dir: str | Path, task: str = "tiny-arith", spec: TrainSpec | None = None,
               log: Callable[[str], None] | None = None) -> dict:
    """Train on the task's train split, export MXFP4, and return a summary with held-out float accuracy."""
    from tokenizers import Tokenizer

    if task not in TASKS:
        raise ValueError(f"unknown training task {task!r}; valid: {', '.join(TASKS)}")
    spec = spec or TrainSpec()
    torch.manual_seed(spec.seed)
    torch.set_num_threads(spec.threads)
    torch.use_deterministic_algorithms(True)
    shape = TinySpec(layers=spec.layers, experts=spec.experts, experts_per_tok=spec.experts_per_tok,
                     moe_intermediate=spec.moe_intermediate)
    out = write_tiny_checkpoint(out_dir, quant="mxfp4", seed=spec.seed, spec=shape)
    config = json.loads((out / "config.json").read_text())
    enc = _Encoder(Tokenizer.from_file(str(out / "tokenizer.json")), config["eos_token_id"], config["pad_token_id"])
    qat = _Qat()
    model = build_model(config, qat)
    start = time.perf_counter()
    loss = train(model, enc, load_items(task_file(task, "train")), spec, qat, log)
    seconds = time.perf_counter() - start
    qat.on = True  # held-out accuracy with the A4W4 numerics the engine serves
    held_out = greedy_accuracy(model, enc, load_items(task_file(task, "test")))
    export(model, out, config)
    summary = {"task": task, "steps": spec.steps, "batch": spec.batch, "seed": spec.seed, "layers": spec.layers,
               "final_loss": round(loss, 5), "train_seconds": round(seconds, 1),
               "held_out_exact_match_qat": held_out, "key": training_key(task, spec)}
    (out / "training.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary
