"""Runtime settings of the bundled engine: the one place their defaults live (the CLI reads these)."""

from __future__ import annotations

from dataclasses import dataclass

KV_CACHE_DTYPES = ("auto", "bfloat16", "fp8")
ALL_REDUCE_MODES = ("auto", "nccl", "one-shot")  # what engine/model/allreduce.py is set up to do (distributed.py)
# 32 tokens of Kimi-K2's hidden 7168 in bf16 (448 KiB) fit: decode batches up to 32 take the one-shot kernel
ONE_SHOT_MAX_BYTES = 512 * 1024


class EngineConfigError(ValueError):
    """A setting that cannot work with this model or machine (the CLI shows it as a user error)."""


@dataclass
class RuntimeConfig:
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    max_model_len: int | None = None  # None: the model's max_position_embeddings
    block_size: int = 32
    num_kv_blocks: int | None = None  # None: from kv_cache_memory, or sized for max_num_seqs full sequences
    kv_cache_memory: float | None = None  # GiB for all layers of this rank's cache
    kv_cache_dtype: str = "auto"  # auto: bf16 for bf16 models, else the model dtype; fp8 = float8_e4m3fn storage
    scheduler_delay_factor: float = 0.0
    # Off: the design card's workload (random prompts) gains nothing from it, and the recipes run vLLM and
    # SGLang with theirs off, so a repeated prompt is never free unless a run asks (docs/engine.md).
    enable_prefix_caching: bool = False
    kv_watermark: float = 0.01  # fraction of blocks kept free when admitting new (not preempted) requests
    cuda_graphs: bool = True  # replay captured decode steps on CUDA with the triton backend (--enforce-eager: off)
    # launch a decode step before the previous one's tokens are read, so host work overlaps the device's
    # (LLMEngine.step; off under tensor parallelism)
    async_scheduling: bool = True
    all_reduce: str = "auto"  # TP sum: one-shot over symmetric memory up to one_shot_max_bytes where it works, else NCCL
    one_shot_max_bytes: int = ONE_SHOT_MAX_BYTES  # largest tensor the one-shot all-reduce takes (its buffer size)

    @property
    def warm_up_ctx(self) -> int:
        """The longest context a prefill attention call can meet as a padded square call (what the engine
        warms up before serving): a chunk holds at most the step budget and takes that path when it is
        at least a quarter of its context (`triton_backend.prefill_attention`)."""
        return min(self.max_model_len or 0, 4 * self.max_num_batched_tokens)

    def validate(self) -> None:
        """Raise ValueError naming the first bad setting."""
        if self.max_num_seqs < 1:
            raise ValueError(f"--max-num-seqs must be >= 1 (got {self.max_num_seqs})")
        if self.max_num_batched_tokens < 1:
            raise ValueError(f"--max-num-batched-tokens must be >= 1 (got {self.max_num_batched_tokens})")
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ValueError(f"--max-model-len must be >= 2 (got {self.max_model_len})")
        if self.block_size < 1 or self.block_size > 4096:
            raise ValueError(f"--block-size must be in 1..4096 (got {self.block_size})")
        if self.num_kv_blocks is not None and self.num_kv_blocks < 1:
            raise ValueError(f"--num-kv-blocks must be >= 1 (got {self.num_kv_blocks})")
        if self.kv_cache_memory is not None and self.kv_cache_memory <= 0:
            raise ValueError(f"--kv-cache-memory must be > 0 GiB (got {self.kv_cache_memory})")
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(f"--kv-cache-dtype must be one of {', '.join(KV_CACHE_DTYPES)} (got {self.kv_cache_dtype})")
        if self.scheduler_delay_factor < 0:
            raise ValueError(f"--scheduler-delay-factor must be >= 0 (got {self.scheduler_delay_factor})")
        if self.all_reduce not in ALL_REDUCE_MODES:
            raise ValueError(f"--all-reduce must be one of {', '.join(ALL_REDUCE_MODES)} (got {self.all_reduce})")
        if not 16 <= self.one_shot_max_bytes <= 1 << 30:
            raise ValueError(f"--one-shot-max-bytes must be in 16..{1 << 30} (got {self.one_shot_max_bytes})")
        if not 0 <= self.kv_watermark < 1:
            raise ValueError(f"kv_watermark must be in [0, 1) (got {self.kv_watermark})")
