"""Images in: a photo file to RGB bytes, and the square, resized float tensor a vision model reads.

Decoding is Pillow's (imported inside the function: an optional package, and a Pyodide package
too), with the EXIF orientation applied as browsers apply it when they draw a photo. The size
Pillow reads from the header is checked against MAX_PIXELS before a pixel is decoded.

Resizing is ours, in numpy, so the page and native give a model the same tensor: a separable
resampling with the triangle (bilinear) filter widened by the scale factor when shrinking, so
every source pixel counts (Pillow's BILINEAR resize does the same; tests/io/test_image.py checks
we agree with it on float images). Plain 4-tap bilinear, as TensorFlow.js's resizeBilinear does,
would skip most pixels of a large photo shrunk to 416 and alias.
"""

from __future__ import annotations

import io
import math
import os

import numpy as np

from ..core.errors import BackendUnavailable, FormatError, InvalidOption, ModelNotFound

# 64 megapixels: larger than any phone photo; 192 MB as RGB bytes, 768 MB as float32.
MAX_PIXELS = 64_000_000


def load_rgb(source) -> np.ndarray:
    """[height, width, 3] uint8 RGB from a path or the file's bytes (JPEG, PNG, WebP, ...)."""
    try:
        from PIL import Image, ImageOps
    except ImportError:
        raise BackendUnavailable("reading photos needs Pillow: pip install 'candle-web[vision]'"
                                 ) from None
    name = "<bytes>" if isinstance(source, (bytes, bytearray, memoryview)) else os.fspath(source)
    try:
        stream = io.BytesIO(bytes(source)) if name == "<bytes>" else open(name, "rb")
    except OSError as error:
        raise ModelNotFound(f"photo {name}: {error.strerror}") from None
    with stream:
        try:
            with Image.open(stream) as image:
                width, height = image.size
                if width * height > MAX_PIXELS:
                    raise FormatError(f"photo {name}: {width}x{height} is more than the "
                                      f"{MAX_PIXELS} pixels a photo may have")
                image = ImageOps.exif_transpose(image)
                return np.asarray(image.convert("RGB"), dtype=np.uint8).copy()
        except FormatError:
            raise
        except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as error:
            raise FormatError(f"photo {name}: not an image Pillow can decode ({error})") from None


def pad_to_square(image: np.ndarray) -> np.ndarray:
    """Zeros (black) added below or to the right of an [h, w, c] image to make it square, as
    face-api pads before resizing: the photo keeps its top-left corner at (0, 0), so a box
    scales back to the photo by one factor."""
    height, width = image.shape[:2]
    side = max(height, width)
    out = np.zeros((side, side) + image.shape[2:], dtype=np.float32)
    out[:height, :width] = image
    return out


def _resample_taps(in_size: int, out_size: int) -> tuple[np.ndarray, np.ndarray]:
    """The triangle filter as taps: (first [out_size], weights [out_size, taps]): output pixel i
    is sum_t weights[i, t] * source[first[i] + t]. Pixel i is centred on (i + 0.5) * scale in
    the source; when shrinking, the filter is `scale` pixels wide. Only the band under each
    filter is computed (a dense [out, in] matrix took 30 ms of a photo's 0.5 s in the page)."""
    scale = in_size / out_size
    width = max(scale, 1.0)
    centers = (np.arange(out_size, dtype=np.float64) + 0.5) * scale
    # Source pixels whose centres (j + 0.5) fall inside the filter's support, as Pillow bounds
    # them (rounding the support's ends to the nearest pixel).
    first = np.maximum(np.floor(centers - width + 0.5), 0).astype(np.int64)
    last = np.minimum(np.floor(centers + width + 0.5), in_size).astype(np.int64)
    sources = first[:, None] + np.arange(int((last - first).max()))[None, :]
    weights = np.maximum(0.0, 1.0 - np.abs((sources + 0.5 - centers[:, None]) / width))
    weights *= sources < last[:, None]
    weights /= weights.sum(axis=1, keepdims=True)
    # Start each band at its first non-zero weight (an end of the support can weigh 0).
    skip = (weights > 0).argmax(axis=1)
    taps = int(((weights > 0).sum(axis=1)).max())
    # Indices as intp: take_along_axis refuses int64 ones where intp is 32 bits (the page).
    columns = np.minimum(skip[:, None] + np.arange(taps)[None, :],
                         weights.shape[1] - 1).astype(np.intp)
    band = np.take_along_axis(weights, columns, axis=1)
    band *= skip[:, None] + np.arange(taps)[None, :] < weights.shape[1]
    return (first + skip).astype(np.intp), band  # intp: np.take's index type in the page


def resize(image: np.ndarray, height: int, width: int) -> np.ndarray:
    """An [h, w, c] image resampled to [height, width, c] float32 (triangle filter, widened
    when shrinking)."""
    if height < 1 or width < 1:
        raise InvalidOption(f"resize: the size must be at least 1x1, got {width}x{height}")
    out = _resample_axis(np.asarray(image), 0, height)
    return np.ascontiguousarray(_resample_axis(out, 1, width))


def _resample_axis(image: np.ndarray, axis: int, out_size: int, in_size: int | None = None
                   ) -> np.ndarray:
    """`image` resampled along `axis` to `out_size`, in float32. Each output line is the
    weighted sum of the few source lines under its filter (a contiguous band of about
    2 * scale + 1), summed tap by tap: out_size x taps lines of work instead of a dense
    [out, in] matrix product. In the page numpy has no BLAS, and the dense products of a
    1920x1280 photo shrunk to 416 took ~100 s of the 104 s a photo took there.
    `in_size` larger than the image's: the lines past its end are zeros (padding), which
    add nothing and are skipped."""
    from ..core.device import Device

    image = np.asarray(image)
    if image.dtype != np.uint8:
        image = image.astype(np.float32, copy=False)
    present = image.shape[axis]
    in_size = present if in_size is None else in_size
    first, band = _resample_taps(in_size, out_size)
    lines = np.ascontiguousarray(image).reshape(
        math.prod(image.shape[:axis]), present, math.prod(image.shape[axis + 1:]))
    # The sums run on the CPU's backend (numpy's loop is the reference; the page's wasm kernel
    # gives its bits in a tenth of the time).
    out = Device.cpu().backend.resample_lines(lines, first, band.astype(np.float32))
    return out.reshape(image.shape[:axis] + (out_size,) + image.shape[axis + 1:])


def square_input(image: np.ndarray, size: int) -> tuple[np.ndarray, float]:
    """The [size, size, 3] float32 tensor a square-input vision model reads (padded below/right,
    then resized), and the factor from its pixels back to the photo's."""
    side = max(image.shape[:2])
    # As resize(pad_to_square(image)), without making the padded float copy: the padding's
    # lines are zeros, which the resampling skips (the same sums, the same bits).
    rows = _resample_axis(np.asarray(image), 0, size, in_size=side)
    return np.ascontiguousarray(_resample_axis(rows, 1, size, in_size=side)), side / size
