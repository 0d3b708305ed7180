"""The one SHA-256 of a file's bytes (run checksums, export manifests, weight hashes)."""
from __future__ import annotations

import hashlib
import os


def sha256_file(path: str | os.PathLike) -> str:
    """Hex SHA-256 of the file at `path`, read in 4 MiB blocks (weights can be gigabytes)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()
