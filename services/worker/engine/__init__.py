"""The worker's engine: per-request state, the paged KV cache, attention, sampling and one model
step per plan (ModelRunner). Synchronous; nothing here touches gRPC or asyncio."""
