"""The worker as a process: the gRPC server around the engine, its health and metrics,
registration with a scheduler, tensor-parallel rank launch, and `layerserve doctor`."""
