"""Model side of the engine: config, MXFP4 format, checkpoint loading, parallel layers, the DeepSeek-V3 /
Kimi-K2 model and its loader. It calls kernels only through the backend it is given (`kernels.KernelBackend`)."""
