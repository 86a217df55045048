"""Episode arrays as compact bytes: token ids int32, log-probs float32, loss mask uint8 (little-endian).

Never JSON lists of numbers. A CRC-32 of the three buffers travels in the metadata, so a corrupted
or truncated payload raises `PayloadError` instead of training on garbage; reading back is bit-identical.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from shared_store.schemas import PayloadError

TOKEN_DTYPE = np.dtype("<i4")
LOGP_DTYPE = np.dtype("<f4")
MASK_DTYPE = np.dtype("u1")
FIELDS = ("token_ids", "logp", "loss_mask")


@dataclass(frozen=True)
class EpisodeArrays:
    """One episode's token arrays, all of shape (T,)."""

    token_ids: npt.NDArray[np.int32]
    logp: npt.NDArray[np.float32]
    loss_mask: npt.NDArray[np.uint8]

    @classmethod
    def of(cls, token_ids: object, logp: object, loss_mask: object) -> EpisodeArrays:
        """Build from any array-likes, converting dtypes; raises ValueError on mismatched lengths."""
        t = np.ascontiguousarray(token_ids, dtype=TOKEN_DTYPE)
        lp = np.ascontiguousarray(logp, dtype=LOGP_DTYPE)
        m = np.ascontiguousarray(loss_mask, dtype=MASK_DTYPE)
        if not (t.ndim == lp.ndim == m.ndim == 1 and len(t) == len(lp) == len(m)):
            raise ValueError(
                f"token_ids, logp and loss_mask must be 1-D of one length, got {t.shape}, {lp.shape}, {m.shape}"
            )
        return cls(t, lp, m)

    def __len__(self) -> int:
        return len(self.token_ids)


def checksum(buffers: tuple[bytes, bytes, bytes]) -> int:
    crc = 0
    for b in buffers:
        crc = zlib.crc32(b, crc)
    return crc


def encode_arrays(arrays: EpisodeArrays) -> tuple[dict[str, bytes], int]:
    """→ ({field: bytes}, crc32)."""
    bufs = (arrays.token_ids.tobytes(), arrays.logp.tobytes(), arrays.loss_mask.tobytes())
    return dict(zip(FIELDS, bufs, strict=True)), checksum(bufs)


def decode_arrays(fields: dict[str, bytes], n_tokens: int, expected_crc: int, what: str) -> EpisodeArrays:
    """Inverse of encode_arrays; checks every length and the checksum."""
    try:
        bufs = (fields["token_ids"], fields["logp"], fields["loss_mask"])
    except KeyError as exc:
        raise PayloadError(f"{what}: array field {exc.args[0]!r} is missing") from exc
    sizes = (TOKEN_DTYPE.itemsize, LOGP_DTYPE.itemsize, MASK_DTYPE.itemsize)
    for name, buf, size in zip(FIELDS, bufs, sizes, strict=True):
        if len(buf) != n_tokens * size:
            raise PayloadError(
                f"{what}: {name} has {len(buf)} bytes, expected {n_tokens * size} for {n_tokens} tokens"
            )
    if checksum(bufs) != expected_crc:
        raise PayloadError(f"{what}: checksum mismatch, the stored arrays are corrupted")
    return EpisodeArrays(
        np.frombuffer(bufs[0], dtype=TOKEN_DTYPE),
        np.frombuffer(bufs[1], dtype=LOGP_DTYPE),
        np.frombuffer(bufs[2], dtype=MASK_DTYPE),
    )
