"""Identity of a full KV block: a hash chained over every token before it and the model.

Two requests share a block exactly when they share the model and every token up to the end of
that block, so a block's hash depends on its parent's hash, its own token ids, and (for the
first block) the model's fingerprint. Only full blocks get a hash: a partial one can still
change.
"""

from __future__ import annotations

import hashlib
from array import array

BlockHash = bytes


def root_hash(model_fingerprint: str) -> BlockHash:
    """The parent of a sequence's first block."""
    return hashlib.blake2b(model_fingerprint.encode(), digest_size=16).digest()


def chain_hash(parent: BlockHash, token_ids: list[int]) -> BlockHash:
    """The hash of one full block of `token_ids` following the block hashed `parent`."""
    h = hashlib.blake2b(parent, digest_size=16)
    h.update(array("i", token_ids).tobytes())
    return h.digest()


def block_hashes(
    token_ids: list[int],
    block_size: int,
    model_fingerprint: str,
    start: int = 0,
    parent: BlockHash | None = None,
) -> list[BlockHash]:
    """Hashes of the full blocks of token_ids, from block index `start` (whose parent hash is
    `parent`, or the root when start is 0). Cost: one blake2b per full block."""
    hashes: list[BlockHash] = []
    prev = parent if parent is not None else root_hash(model_fingerprint)
    for begin in range(start * block_size, len(token_ids) - block_size + 1, block_size):
        prev = chain_hash(prev, token_ids[begin : begin + block_size])
        hashes.append(prev)
    return hashes
