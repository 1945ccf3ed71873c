"""The DeepSeek-V3 / Kimi-K2 model: MLA attention over a paged latent cache, dense then MoE MLPs."""

from k2bench.engine.model.deepseek import DeepseekV3ForCausalLM

__all__ = ["DeepseekV3ForCausalLM"]
