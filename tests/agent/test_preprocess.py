import cv2
import numpy as np
import pytest

from edgedeploy_agent.bundle import Preprocess, TensorSpec
from edgedeploy_agent.preprocess import preprocess


def test_rgb_nchw_mean_std_matches_numpy() -> None:
    rng = np.random.default_rng(0)
    frame = rng.integers(0, 256, size=(6, 4, 3), dtype=np.uint8)  # BGR
    spec = TensorSpec(name="x", shape=[1, 3, 6, 4], layout="NCHW")
    pp = Preprocess(color="rgb", mean=[127.5, 127.5, 127.5], std=[127.5, 127.5, 127.5])
    x = preprocess(frame, pp, spec)
    expect = ((frame[:, :, ::-1].astype(np.float32) - 127.5) / 127.5).transpose(2, 0, 1)[None]
    assert x.shape == (1, 3, 6, 4) and x.dtype == np.float32 and x.flags.c_contiguous
    np.testing.assert_allclose(x, expect, rtol=0, atol=1e-6)


def test_gray_scale_and_resize() -> None:
    frame = np.full((64, 64, 3), 255, dtype=np.uint8)
    frame[:32] = 0
    spec = TensorSpec(name="x", shape=[1, 1, 8, 8], layout="NCHW")
    x = preprocess(frame, Preprocess(color="gray", interpolation="area", scale=1 / 255), spec)
    assert x.shape == (1, 1, 8, 8)
    np.testing.assert_allclose(x[0, 0, :4], 0.0, atol=1e-6)
    np.testing.assert_allclose(x[0, 0, 4:], 1.0, atol=1e-6)


def test_center_crop_nhwc() -> None:
    frame = np.zeros((100, 200, 3), dtype=np.uint8)
    frame[:, 50:150] = (10, 20, 30)  # the centre square is uniform
    spec = TensorSpec(name="x", shape=[1, 10, 10, 3], layout="NHWC")
    x = preprocess(frame, Preprocess(color="bgr", resize="center_crop", crop_fraction=1.0), spec)
    assert x.shape == (1, 10, 10, 3)
    np.testing.assert_array_equal(x[0, :, :, 0], 10)
    np.testing.assert_array_equal(x[0, :, :, 2], 30)
    # 87.5% of the short side, as MobileNet expects
    crop = preprocess(frame, Preprocess(color="bgr", resize="center_crop", crop_fraction=0.875), spec)
    expect = cv2.resize(frame[6:94, 56:144], (10, 10), interpolation=cv2.INTER_LINEAR_EXACT).astype(np.float32)
    np.testing.assert_allclose(crop[0], expect)


def test_channel_mismatch_is_an_error() -> None:
    spec = TensorSpec(name="x", shape=[1, 3, 4, 4], layout="NCHW")
    with pytest.raises(ValueError, match="1 channels"):
        preprocess(np.zeros((4, 4, 3), np.uint8), Preprocess(color="gray"), spec)
