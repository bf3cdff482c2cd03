"""edgedeploy: build, package, ship and watch models on NVIDIA edge devices (host side)."""

__version__ = "0.1.0"
