"""What a Python has for the agent: its OpenCV (with GStreamer, for CSI and gst: sources?) and TensorRT.

Python 3.8, standard library only (nothing heavy is imported): the sidecar worker reports it for JetPack's
Python, the agent for its own, and `edgedeploy-agent selftest` shows both.
"""

from __future__ import annotations

import importlib.util
import platform
import re
import sys
from typing import Any, Dict


def has_gstreamer(build_information: str) -> bool:
    """Whether an OpenCV build-information text says GStreamer: YES (the pip wheels say NO)."""
    m = re.search(r"^\s*GStreamer:\s*(\S+)", build_information, re.MULTILINE)
    return bool(m and m.group(1).upper().startswith("YES"))


def opencv_facts() -> Dict[str, Any]:
    """This Python's OpenCV version (None without cv2) and whether it has GStreamer."""
    try:
        import cv2
    except ImportError as e:
        return {"opencv": None, "gstreamer": False, "opencv_error": str(e)}
    return {"opencv": cv2.__version__, "gstreamer": has_gstreamer(cv2.getBuildInformation())}


def tensorrt_version() -> str | None:
    """TensorRT's Python bindings here: their version, "unknown" without package metadata, None when absent.
    Not imported: importing TensorRT takes seconds and, without a driver, can crash the process."""
    if importlib.util.find_spec("tensorrt") is None:
        return None
    from importlib import metadata

    for name in ("tensorrt", "tensorrt-cu12", "tensorrt_cu12"):
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return "unknown"


def capture_facts() -> Dict[str, Any]:
    """What capture needs to know of this Python: which it is, and its OpenCV."""
    return {"python": platform.python_version(), "executable": sys.executable, **opencv_facts()}


def python_facts() -> Dict[str, Any]:
    """All of it: also TensorRT (the self-test's `pythons` check, the worker's `info`)."""
    return {**capture_facts(), "tensorrt": tensorrt_version()}
