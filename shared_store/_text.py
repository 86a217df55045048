"""Conversions of raw redis-py replies (bytes or str) to str."""

from __future__ import annotations


def as_str(value: object) -> str:
    if isinstance(value, bytes):
        return value.decode()
    if isinstance(value, str):
        return value
    raise TypeError(f"expected a Redis string reply, got {type(value).__name__}")
