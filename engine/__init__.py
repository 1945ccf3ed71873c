"""The bundled engine: a compact MXFP4 tensor-parallel server for the DeepSeek-V3 / Kimi-K2 architecture."""
