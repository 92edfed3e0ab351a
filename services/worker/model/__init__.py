"""The model engine's model code: configuration, weight loaders and the Llama network."""
