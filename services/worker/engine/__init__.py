"""The worker's engine: per-request state, sampling and one model step per plan (ModelRunner),
over the layers (services/worker/layers/). Synchronous; nothing here touches gRPC or asyncio."""
