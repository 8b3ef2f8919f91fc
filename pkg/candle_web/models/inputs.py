"""Input checks shared by the text models: token ids and padding masks."""

from __future__ import annotations

import numpy as np

from ..core import dtype as dt
from ..core.errors import ShapeMismatch
from ..core.tensor import Tensor

# Added to the scores of padded positions: the most negative f32, so softmax gives them 0
# without producing NaN when a whole row is masked (as -inf would).
MASKED = float(np.finfo(np.float32).min)


def token_ids(ids, device, what: str) -> Tensor:
    """Integer ids [batch, seq] (a [seq] row is promoted) as an i64/u32 Tensor on `device`;
    ragged rows, floats or an empty sequence raise ShapeMismatch naming `what`."""
    if not isinstance(ids, Tensor):
        array = np.asarray(ids)
        if array.dtype == object or (array.size and not np.issubdtype(array.dtype, np.integer)):
            raise ShapeMismatch(f"{what}: expected integer token ids [batch, seq] (integer ids in "
                                f"rows of equal length; pad and pass attention_mask), got {array.dtype}")
        ids = Tensor.from_numpy(array.astype(np.int64), dt.i64, device)
    if ids.rank == 1:
        ids = ids.unsqueeze(0)
    if ids.rank != 2 or ids.dims()[1] == 0 or ids.dtype.is_float:
        raise ShapeMismatch(f"{what}: expected integer token ids [batch, seq] with seq > 0, got "
                            f"{ids.dtype.name} {list(ids.shape)}")
    return ids


def additive_padding_mask(attention_mask, b: int, t: int, device, what: str):
    """A 1/0 attention mask [b, t] as additive scores [b, 1, 1, t]; None when nothing is
    masked, so unpadded batches take the unmasked fast path."""
    if attention_mask is None:
        return None
    mask = attention_mask.to_numpy() if isinstance(attention_mask, Tensor) else np.asarray(attention_mask)
    if mask.ndim == 1:
        mask = mask[None, :]
    if mask.shape != (b, t):
        raise ShapeMismatch(f"{what}: attention_mask {list(mask.shape)} does not match the input ids "
                            f"[{b}, {t}]")
    if mask.all():
        return None
    additive = np.where(mask > 0, 0.0, MASKED).astype(np.float32).reshape(b, 1, 1, t)
    return Tensor.from_numpy(additive, dt.f32, device)
