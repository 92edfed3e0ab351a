"""The networks (Llama, Gemma 3) built from services/worker/layers/, their configs, weight
loaders, quantization and tensor-parallel sharding."""
