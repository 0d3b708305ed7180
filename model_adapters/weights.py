"""Weight-file hashes for model identities, remembered on disk so a large file is read once."""
from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from pathlib import Path
from typing import Iterable

from evalkit import atomic
from evalkit.digest import sha256_file

_lock = threading.Lock()
_memo: dict[str, str] = {}


def evalkit_cache_dir() -> Path:
    """`$EVALKIT_CACHE`, else ~/.cache/evalkit (converted weights, file hashes)."""
    return Path(os.environ.get("EVALKIT_CACHE") or "~/.cache/evalkit").expanduser()


def shipped_checkpoint(folder: Path, name: str, make: str) -> Path:
    """The folder of a model whose weights ship in the repository; a missing checkpoint is an
    error naming the command `make` that trains it."""
    if not (folder / "model.safetensors").is_file():
        raise FileNotFoundError(f"{name}: checkpoint {folder} is not there yet; train it with "
                                f"`{make}`")
    return folder


# A remembered hash is trusted only for a file whose status change time (ctime) is older than
# the moment hashing began by more than this: a filesystem with coarse timestamps (1 s, 2 s on
# FAT) can give a file rewritten just after it was hashed the ctime it had when it was hashed,
# so such an entry is hashed again (git's "racily clean" rule).
RACY_NS = 3_000_000_000


def _stat_key(p: Path, st: os.stat_result) -> str:
    """What must be unchanged for a remembered hash to hold: the path, device and inode (a file
    replaced by rename is another inode), size, mtime, and ctime. A user can put an mtime back
    (os.utime, touch -d) but not a ctime: any write or utime sets it to now, so an overwrite of
    the same size with the mtime restored still changes the key."""
    return (f"{p}|dev={st.st_dev}|ino={st.st_ino}|size={st.st_size}|mtime={st.st_mtime_ns}"
            f"|ctime={st.st_ctime_ns}")


def file_sha256(path: str | os.PathLike) -> str:
    """SHA-256 of a file, computed once per (path, inode, size, mtime, ctime) and remembered in
    the cache dir (a weights file can be gigabytes; its hash is part of every model identity)."""
    p = Path(path).resolve()
    st = p.stat()
    key = _stat_key(p, st)
    with _lock:
        if key in _memo:
            return _memo[key]
    store = evalkit_cache_dir() / "sha256-cache.json"
    try:
        known = json.loads(store.read_text())
    except (OSError, ValueError):
        known = {}
    entry = known.get(key) if isinstance(known, dict) else None
    if isinstance(entry, dict) and isinstance(entry.get("sha256"), str) and _settled(st, entry):
        digest = entry["sha256"]
    else:
        began = time.time_ns()
        digest = sha256_file(p)
        if _stat_key(p, p.stat()) != key:  # changed while it was read: the bytes hashed are no one file's
            raise OSError(f"{p}: the file changed while it was hashed; hash it again when "
                          f"it is no longer being written")
        known = known if isinstance(known, dict) else {}
        known[key] = {"sha256": digest, "hashed_at_ns": began}
        try:
            atomic.write_json(store, known)
        except OSError:
            pass  # a read-only cache dir only costs a re-hash next time
        if not _settled(st, known[key]):
            return digest  # too fresh to remember (see RACY_NS)
    with _lock:
        _memo[key] = digest
    return digest


def _settled(st: os.stat_result, entry: dict) -> bool:
    began = entry.get("hashed_at_ns")
    return (isinstance(began, int) and st.st_ctime_ns < began - RACY_NS
            and st.st_mtime_ns < began - RACY_NS)


def weights_hash(files: Iterable[str | os.PathLike]) -> str:
    """The `weights_hash` identity key: one file's SHA-256, or for shards the SHA-256 of their
    sorted "name:sha256" lines (so a single-file checkpoint's hash is its file's)."""
    hashes = {Path(f).name: file_sha256(f) for f in files}
    if not hashes:
        raise ValueError("weights_hash: no weight files")
    if len(hashes) == 1:
        return next(iter(hashes.values()))
    return hashlib.sha256("".join(f"{k}:{v}\n" for k, v in sorted(hashes.items()))
                          .encode()).hexdigest()


class WeightFileError(ValueError):
    """A weight file that is not a complete safetensors file, or holds the wrong kind of tensor."""


# safetensors' dtype names of floating-point tensors
_FLOATING = {"F64", "F32", "F16", "BF16", "F8_E4M3", "F8_E5M2"}


def safetensors_dtypes(path: str | os.PathLike) -> dict[str, str]:
    """{tensor name: dtype ("F32", "I8", ...)} from a safetensors file's header, without reading
    the tensors. Raises WeightFileError naming the file when it is truncated or not safetensors
    (the header's offsets must cover the whole file, so a cut file is caught here)."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            return {k: f.get_slice(k).get_dtype() for k in f.keys()}
    except (SafetensorError, OSError) as e:
        raise WeightFileError(f"{path}: not a complete safetensors file ({e}); the file is "
                              f"truncated or corrupt, re-download or re-save it") from None


def check_floating(path: str | os.PathLike, names: Iterable[str] | None = None) -> None:
    """Refuse an integer or boolean tensor (a quantised int8 weight, ...) among `names` (default:
    every tensor) where the model expects floating-point weights: a cast would silently turn
    quantised codes into wrong weights."""
    wanted = None if names is None else set(names)
    for name, dtype in safetensors_dtypes(path).items():
        if dtype not in _FLOATING and (wanted is None or name in wanted):
            raise WeightFileError(f"{path}: tensor {name!r} is {dtype}, expected floating-point "
                                  f"weights ({', '.join(sorted(_FLOATING))}); a quantised "
                                  f"checkpoint must be dequantised first")


def index_shards(path: str | os.PathLike) -> list[str]:
    """The shard file names a model.safetensors.index.json lists (its weight_map's values)."""
    try:
        index = json.loads(Path(path).read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise WeightFileError(f"{path}: not valid JSON ({e})") from None
    wmap = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(wmap, dict) or not wmap or not all(
            isinstance(v, str) and v for v in wmap.values()):
        raise WeightFileError(f"{path}: expected an object with a non-empty \"weight_map\" of "
                              f"tensor name -> shard file name")
    return sorted(set(wmap.values()))
