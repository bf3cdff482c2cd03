"""Which OpenCV a Python has, and whether it was built with GStreamer (what CSI and gst: sources need).

Python 3.8, standard library only (cv2 is imported on call): the sidecar worker reports it for JetPack's
Python, the agent for its own.
"""

from __future__ import annotations

import re
from typing import Any


def has_gstreamer(build_information: str) -> bool:
    """Whether an OpenCV build-information text says GStreamer: YES (the pip wheels say NO)."""
    m = re.search(r"^\s*GStreamer:\s*(\S+)", build_information, re.MULTILINE)
    return bool(m and m.group(1).upper().startswith("YES"))


def opencv_facts() -> dict[str, Any]:
    """This Python's OpenCV version (None without cv2) and whether it has GStreamer."""
    try:
        import cv2
    except ImportError as e:
        return {"opencv": None, "gstreamer": False, "opencv_error": str(e)}
    return {"opencv": cv2.__version__, "gstreamer": has_gstreamer(cv2.getBuildInformation())}
