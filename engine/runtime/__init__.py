"""Runtime side of the engine: sequences, block manager, scheduler, model runner, CUDA graphs, TP worker
processes and the OpenAI-compatible server. It reaches the model only through `model.loader.load_model`."""
