"""The sidecar: TensorRT and GStreamer capture under JetPack's own Python, for an agent that runs in another.

On JetPack 5 the system Python is 3.8 and only it has TensorRT's bindings and NVIDIA's GStreamer-enabled OpenCV;
the agent runs in a Python 3.9 venv (apache-tvm-ffi has no 3.8 wheels). When the agent's Python lacks them and
`system_python` is configured, the agent starts a worker under that Python and talks to it through pipes,
with arrays and engine plans in shared memory:

    agent (3.9 venv)                                   worker (python3.8 -m edgedeploy_agent.sidecar.worker)
    runtime/tensorrt.py: engine cache, key, acceptance  trt_backend.py: TensorRT through Polygraphy
      -> tensorrt_client.py  ---- channel.py ---->      worker.py (role tensorrt)
    sources/capture.py: the capture thread             cv2.VideoCapture(..., CAP_GSTREAMER)
      -> capture_client.py   ---- channel.py ---->      worker.py (role capture)
    process.py: start, requests with deadlines, death and hang detection

Runs under Python 3.8 (`make lint`: vermin -t=3.8): channel.py, worker.py, trt_backend.py, cuda_probe.py,
python_facts.py, and what they import (errors.py, durable.py, gpu.py); standard library and numpy only, no
pydantic. process.py and the two clients run in the agent.
"""
