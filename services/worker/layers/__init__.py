"""What every model shares and the engine drives (nano-vllm's layers/): the attention backends
and the step's attention layout, the paged KV cache, RoPE tables, weight helpers and the Hugging
Face names of fused projections. model/ and engine/ both import it; it imports neither."""
