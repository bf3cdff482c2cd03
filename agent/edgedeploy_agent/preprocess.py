"""The one preprocessing implementation: a BGR frame (H, W, 3) uint8 -> a model input tensor.

The host's calibration, evaluation and tests import this same function, so what a model sees on the
device is exactly what it was measured with.
"""

import cv2
import numpy as np

from .bundle import Preprocess, TensorSpec

_INTERP = {"area": cv2.INTER_AREA, "linear": cv2.INTER_LINEAR, "nearest": cv2.INTER_NEAREST}


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
    """Colour convert, crop/resize, normalise and lay out one frame as a batch of one."""
    h, w, c = input_hw(spec)
    img = frame_bgr
    if pp.resize == "center_crop":
        img = _center_crop(img, pp.crop_fraction)
    if img.shape[0] != h or img.shape[1] != w:
        img = cv2.resize(img, (w, h), interpolation=_INTERP[pp.interpolation])
    if pp.color == "gray":
        img = cv2.cvtColor(img, cv2.COLOR_BGR2GRAY)[:, :, None] if img.ndim == 3 else img[:, :, None]
    elif pp.color == "rgb":
        img = cv2.cvtColor(img, cv2.COLOR_BGR2RGB)
    if img.shape[2] != c:
        raise ValueError(f"preprocessing gives {img.shape[2]} channels, input {spec.name} wants {c}")
    x = img.astype(np.float32)
    x *= np.float32(pp.scale)
    mean = np.asarray(pp.mean, dtype=np.float32)
    std = np.asarray(pp.std, dtype=np.float32)
    if not (np.all(mean == 0) and np.all(std == 1)):
        x -= mean
        x /= std
    if spec.layout == "NCHW":
        x = x.transpose(2, 0, 1)
    return np.ascontiguousarray(x[None], dtype=np.dtype(spec.dtype))


def _center_crop(img: np.ndarray, fraction: float) -> np.ndarray:
    ih, iw = img.shape[:2]
    side = int(round(min(ih, iw) * fraction))
    top, left = (ih - side) // 2, (iw - side) // 2
    return img[top : top + side, left : left + side]
