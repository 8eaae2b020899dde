"""Caller buffers as flat byte views, without copies."""

from __future__ import annotations


def byte_view(buffer: object, writable: bool = False) -> memoryview:
    """A flat unsigned-byte memoryview of any C-contiguous buffer (bytes, bytearray, a numpy
    array, a memoryview; a CPU tensor through `.numpy()`: see `pool_buffers`). ValueError for one
    that is not contiguous, or not writable when `writable`: a caller's mistake, not a miss."""
    try:
        view = memoryview(buffer)
    except TypeError as exc:
        raise ValueError(f"not a buffer: {type(buffer).__name__}") from exc
    if not view.c_contiguous:
        raise ValueError("a tier buffer must be C-contiguous")
    if view.format != "B" or view.ndim != 1:
        view = view.cast("B")
    if writable and view.readonly:
        raise ValueError("a fetch's destination buffers must be writable")
    return view
