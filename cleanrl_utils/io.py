"""Crash-safe file writes: a reader never sees a half-written model or checkpoint."""

from __future__ import annotations

import os
import tempfile
from typing import Any

import torch


def atomic_torch_save(obj: Any, path: str) -> str:
    """``torch.save`` to a temporary file in the same folder, fsync it, then rename it into place."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".part", dir=folder)
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    # Make the rename itself durable.
    dir_fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    return path
