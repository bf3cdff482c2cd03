"""The one preprocessing implementation: a BGR frame (H, W, 3) uint8 -> a model input tensor.

The host's calibration, evaluation and tests import this same function, so what a model sees on the
device is exactly what it was measured with: every OpenCV call here gives the same bytes on x86 and arm64
(checked with the pip wheels under QEMU; `_INTERP`).
"""

from typing import Optional

import cv2
import numpy as np

from .aligned import aligned_empty
from .bundle import Preprocess, TensorSpec

# "linear" is OpenCV's bit-exact bilinear resize: plain INTER_LINEAR is not the same on every machine. The
# aarch64 wheels of opencv-python-headless hand it to an Arm HAL (KleidiCV): 5.1.0 there gave another value
# in 20 % of the pixels of a 300x260 -> 224x224 resize than on x86 (INTER_LINEAR_EXACT, INTER_AREA and
# BGR2GRAY: the same bytes), enough to move an INT8 MobileNet's top-5 scores on an emulated Jetson.
_INTERP = {"area": cv2.INTER_AREA, "linear": cv2.INTER_LINEAR_EXACT, "nearest": cv2.INTER_NEAREST}


def input_hw(spec: TensorSpec) -> tuple[int, int, int]:
    """(height, width, channels) of an image input from its shape and layout."""
    if len(spec.shape) != 4 or spec.layout not in ("NCHW", "NHWC"):
        raise ValueError(f"input {spec.name} is not an NCHW/NHWC image tensor: {spec.shape} {spec.layout}")
    if spec.layout == "NCHW":
        _, c, h, w = spec.shape
    else:
        _, h, w, c = spec.shape
    return h, w, c


def preprocess(frame_bgr: np.ndarray, pp: Preprocess, spec: TensorSpec, out: Optional[np.ndarray] = None) -> np.ndarray:
    """Colour convert, crop/resize, normalise and lay out one frame as a batch of one.

    After the (small) resize, everything is one pass over the pixels: the colour swap and the NCHW
    transpose are views of the uint8 image, and (x * scale - mean) / std is applied as x * a + b
    while writing the float tensor, so the frame is not copied once per step. `out`: a float32 array of the
    input's shape to write into (a GPU runtime's page-locked input: no copy before the upload), else a new one.
    """
    h, w, c = input_hw(spec)
    img = frame_bgr
    if pp.resize == "center_crop":
        top, left, ch, cw = crop_box(img.shape[0], img.shape[1], pp)
        img = img[top : top + ch, left : left + cw]
    if img.shape[0] != h or img.shape[1] != w:
        img = cv2.resize(img, (w, h), interpolation=_INTERP[pp.interpolation])
    if pp.color == "gray":
        img = cv2.cvtColor(img, cv2.COLOR_BGR2GRAY)[:, :, None] if img.ndim == 3 else img[:, :, None]
    elif pp.color == "rgb":
        img = img[:, :, ::-1]
    if img.shape[2] != c:
        raise ValueError(f"preprocessing gives {img.shape[2]} channels, input {spec.name} wants {c}")
    gain, offset = normalisation(pp, c)
    shape = (1, c, h, w) if spec.layout == "NCHW" else (1, h, w, c)
    if out is None or out.shape != shape or out.dtype != np.float32:
        out = aligned_empty(shape, np.float32)
    if spec.layout == "NCHW":
        src, gain_b, offset_b = img.transpose(2, 0, 1), gain[:, None, None], offset[:, None, None]
    else:
        src, gain_b, offset_b = img, gain, offset
    np.multiply(src, gain_b, out=out[0], dtype=np.float32)
    if np.any(offset != 0):
        out[0] += offset_b
    if np.dtype(spec.dtype) == np.float32:
        return out
    cast = aligned_empty(out.shape, spec.dtype)
    cast[...] = out
    return cast


def normalisation(pp: Preprocess, channels: int) -> tuple[np.ndarray, np.ndarray]:
    """(gain, offset), float32 per channel: (x * scale - mean) / std is x * gain + offset."""
    mean = np.broadcast_to(np.asarray(pp.mean, dtype=np.float64), (channels,))
    std = np.broadcast_to(np.asarray(pp.std, dtype=np.float64), (channels,))
    return (pp.scale / std).astype(np.float32), (-mean / std).astype(np.float32)


def crop_box(ih: int, iw: int, pp: Preprocess) -> tuple[int, int, int, int]:
    """(top, left, height, width) of the part of an ih x iw frame that is resized."""
    if pp.resize != "center_crop":
        return 0, 0, ih, iw
    side = int(round(min(ih, iw) * pp.crop_fraction))
    return (ih - side) // 2, (iw - side) // 2, side, side


def resize_taps(box: tuple[int, int, int, int], interpolation: str, spec: TensorSpec) -> tuple[np.ndarray, np.ndarray]:
    """The crop `box` (top, left, height, width; crop_box) resized to `spec`'s size, as two tap tables for the GPU
    kernel (host compile module preprocess_kernel.py): int32 (width, 4) and (height, 4), each row (source index 0,
    source index 1, weight 0, weight 1), 8-bit weights summing to 256, source indices in frame coordinates.
    OpenCV's INTER_LINEAR_EXACT and INTER_NEAREST, reproduced: the same bytes (tests/test_gpu_preprocess.py)."""
    if interpolation not in ("linear", "nearest"):
        raise ValueError(f"interpolation {interpolation!r} has no tap table (linear, nearest)")
    h, w, _ = input_hw(spec)
    top, left, ch, cw = box
    return _taps(cw, w, left, interpolation), _taps(ch, h, top, interpolation)


def _taps(src: int, dst: int, start: int, interpolation: str) -> np.ndarray:
    out = np.zeros((dst, 4), np.int32)
    d = np.arange(dst, dtype=np.float64)
    scale = 1.0 / (dst / src)  # OpenCV: inv_scale = dsize / ssize, then its reciprocal, in double
    if src == dst:  # OpenCV copies: the identity
        i, a = d.astype(np.int64), np.zeros(dst, np.int64)
    elif interpolation == "nearest":
        i, a = np.minimum(np.floor(d * scale).astype(np.int64), src - 1), np.zeros(dst, np.int64)
    else:
        f = (d + 0.5) * scale - 0.5
        i = np.floor(f).astype(np.int64)
        frac = f - i
        low, high = i < 0, i >= src - 1
        i[low], frac[low] = 0, 0.0
        i[high], frac[high] = src - 1, 0.0
        a = np.rint(frac * 256).astype(np.int64)  # round half to even, as OpenCV's softdouble cvRound
    out[:, 0] = start + i
    out[:, 1] = start + np.minimum(i + 1, src - 1)
    out[:, 2] = 256 - a
    out[:, 3] = a
    return out
