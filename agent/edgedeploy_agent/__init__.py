"""edgedeploy-agent: the on-device half of edgedeploy.

It verifies and activates bundles atomically, runs them with the TVM runtime (or TensorRT, imported
lazily where the device has it), and spools reports for the host to pull. It imports no compiler,
no SSH library and no CLI framework, and it runs on Python 3.9 (JetPack 5 devices).
"""

__version__ = "0.1.0"
