"""The checkpoint file format alone: one ``.npz`` holding the state's arrays, a JSON
description and a SHA-256 checksum over both, written beside the file and moved over it only
once complete. What the description says is the optimizer's business (steadystep.decentral.optimizer);
nothing here imports back."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Union

import numpy as np

__all__ = [
    "ARRAY_PREFIX",
    "FORMAT",
    "read",
    "write",
    "written_beside",
]


FORMAT = "steadystep.decentral/1"  # what a description says it is (the optimizer checks it)


ARRAY_PREFIX = "array/"  # the caller's own arrays in a checkpoint (save(arrays=...))


@contextlib.contextmanager
def written_beside(path: Path, suffix: str) -> Iterator[Path]:
    """A file beside ``path`` for the block to write, moved over ``path`` (atomically) when the
    block succeeds and removed when it fails (a full disk, a directory at path, an interrupt):
    the previous file at ``path`` stays intact, and no half-written one is left beside it."""
    side = path.with_name(path.name + suffix)
    try:
        yield side
        os.replace(side, path)
    except BaseException:
        with contextlib.suppress(OSError):  # the original error is the one to report
            side.unlink(missing_ok=True)
        raise


def _json_default(value: Any) -> Any:
    """What JSON cannot write itself: NumPy scalars and arrays, torch tensors (an epoch count
    from np.argmax, a loss from .min()) become Python numbers and lists."""
    if callable(getattr(value, "tolist", None)):
        return value.tolist()
    raise TypeError(
        f"extra holds {type(value).__name__} {value!r:.80}, which a checkpoint cannot store; "
        "pass numbers, strings, lists and dicts (a NumPy array or torch tensor becomes a list)"
    )


def _digest(text: str, host: dict[str, np.ndarray]) -> bytes:
    digest = hashlib.sha256(text.encode())
    for name in sorted(host):
        digest.update(name.encode())
        digest.update(str(host[name].dtype).encode() + str(host[name].shape).encode())
        digest.update(np.ascontiguousarray(host[name]).data)
    return digest.digest()


def write(path: Union[str, Path], meta: dict[str, Any], host: dict[str, np.ndarray]) -> None:
    """Write the host arrays and the description ``meta`` (JSON; NumPy and torch numbers and
    arrays in it become Python numbers and lists) to ``path``, with their checksum: beside it
    first, then in its place."""
    text = json.dumps(meta, sort_keys=True, default=_json_default)
    with written_beside(Path(path), ".partial") as partial, open(partial, "wb") as file:
        contents: dict[str, Any] = {
            "meta": np.frombuffer(text.encode(), np.uint8),
            "checksum": np.frombuffer(_digest(text, host), np.uint8),
            **host,
        }
        np.savez(file, **contents)


def read(path: Union[str, Path]) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """The description and the arrays of the file at ``path``, its checksum verified: a damaged
    or foreign file raises ValueError, a missing one FileNotFoundError (as open() says it:
    "resume if there is a checkpoint" catches it)."""
    try:
        with np.load(Path(path)) as archive:
            text = bytes(archive["meta"]).decode()
            host = {name: archive[name] for name in archive.files if name not in ("meta", "checksum")}
            checksum = bytes(archive["checksum"])
    except (FileNotFoundError, IsADirectoryError, PermissionError):
        raise
    except (OSError, KeyError, ValueError, EOFError, zipfile.BadZipFile) as error:
        raise ValueError(f"{path} is not a readable steadystep.decentral checkpoint ({error})") from None
    if checksum != _digest(text, host):
        raise ValueError(f"{path} is corrupted: its checksum does not match its contents")
    return json.loads(text), host
