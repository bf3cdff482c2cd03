"""The one preprocessing implementation: a BGR frame (H, W, 3) uint8 -> a model input tensor.

The host's calibration, evaluation and tests import this same function, so what a model sees on the
device is exactly what it was measured with: every OpenCV call here gives the same bytes on x86 and arm64
(checked with the pip wheels under QEMU; `_INTERP`).
"""

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


def preprocess(frame_bgr: np.ndarray, pp: Preprocess, spec: TensorSpec) -> np.ndarray:
    """Colour convert, crop/resize, normalise and lay out one frame as a batch of one.

    After the (small) resize, everything is one pass over the pixels: the colour swap and the NCHW
    transpose are views of the uint8 image, and (x * scale - mean) / std is applied as x * a + b
    while writing the float tensor, so the frame is not copied once per step.
    """
    h, w, c = input_hw(spec)
    img = frame_bgr
    if pp.resize == "center_crop":
        img = _center_crop(img, pp.crop_fraction)
    if img.shape[0] != h or img.shape[1] != w:
        img = cv2.resize(img, (w, h), interpolation=_INTERP[pp.interpolation])
    if pp.color == "gray":
        img = cv2.cvtColor(img, cv2.COLOR_BGR2GRAY)[:, :, None] if img.ndim == 3 else img[:, :, None]
    elif pp.color == "rgb":
        img = img[:, :, ::-1]
    if img.shape[2] != c:
        raise ValueError(f"preprocessing gives {img.shape[2]} channels, input {spec.name} wants {c}")
    mean = np.broadcast_to(np.asarray(pp.mean, dtype=np.float64), (c,))
    std = np.broadcast_to(np.asarray(pp.std, dtype=np.float64), (c,))
    gain = (pp.scale / std).astype(np.float32)
    offset = (-mean / std).astype(np.float32)
    if spec.layout == "NCHW":
        out = aligned_empty((1, c, h, w), np.float32)
        src, gain_b, offset_b = img.transpose(2, 0, 1), gain[:, None, None], offset[:, None, None]
    else:
        out = aligned_empty((1, h, w, c), np.float32)
        src, gain_b, offset_b = img, gain, offset
    np.multiply(src, gain_b, out=out[0], dtype=np.float32)
    if np.any(offset != 0):
        out[0] += offset_b
    if np.dtype(spec.dtype) == np.float32:
        return out
    cast = aligned_empty(out.shape, spec.dtype)
    cast[...] = out
    return cast


def _center_crop(img: np.ndarray, fraction: float) -> np.ndarray:
    ih, iw = img.shape[:2]
    side = int(round(min(ih, iw) * fraction))
    top, left = (ih - side) // 2, (iw - side) // 2
    return img[top : top + side, left : left + side]
