"""NVIDIA GPU energy through NVML (the nvidia-ml-py package, imported only when used)."""

from typing import Any

from .power import SensorUnavailable


class NvmlEnergy:
    """nvmlDeviceGetTotalEnergyConsumption (mJ since the driver loaded; Volta and newer, so the T4)."""

    name = "nvml"

    def __init__(self, index: int = 0) -> None:
        try:
            import pynvml
        except ImportError:
            raise SensorUnavailable("nvml: nvidia-ml-py is not installed (extra edgedeploy[agent-nvidia])") from None
        try:
            pynvml.nvmlInit()
            self._handle: Any = pynvml.nvmlDeviceGetHandleByIndex(index)
            pynvml.nvmlDeviceGetTotalEnergyConsumption(self._handle)
        except pynvml.NVMLError as e:
            raise SensorUnavailable(f"nvml: {e} (no NVIDIA driver or GPU {index}, or no energy counter)") from None
        self._nvml = pynvml

    def read_joules(self) -> float:
        return float(self._nvml.nvmlDeviceGetTotalEnergyConsumption(self._handle)) / 1e3

    def read_watts(self) -> float:
        """Board power now (instantaneous on Turing and older, a 1 s average on Ampere and newer)."""
        return float(self._nvml.nvmlDeviceGetPowerUsage(self._handle)) / 1e3
