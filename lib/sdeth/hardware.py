"""What a result ran on: stored in every results JSON."""
from __future__ import annotations

import os
import platform


def _cpu_model() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _mem_gib() -> float | None:
    try:
        for line in open("/proc/meminfo"):
            if line.startswith("MemTotal"):
                return round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    return None


NODE0_MEMINFO = "/sys/devices/system/node/node0/meminfo"


def node0_mem_gib(path: str | None = None) -> float | None:
    """NUMA node 0's MemTotal as the kernel reports it, for the record only: on some virtual machines it
    reads far below `free` (a few GB of 24) and grows as memory is used, so nothing is sized from it."""
    try:
        for line in open(path or NODE0_MEMINFO):
            if "MemTotal:" in line:
                return round(int(line.split()[3]) / 2**20, 2)
    except (OSError, IndexError, ValueError):
        pass
    return None


def describe(device: str = "cpu") -> dict:
    import torch
    import transformers
    info = {
        "host": platform.node(), "os": platform.platform(), "python": platform.python_version(),
        "cpu": _cpu_model(), "cpu_cores": os.cpu_count(), "torch_threads": torch.get_num_threads(),
        "memory_gib": _mem_gib(), "numa_node0_memtotal_gib": node0_mem_gib(), "torch": torch.__version__, "transformers": transformers.__version__,
        "device": device, "gpu": None,
    }
    if device.startswith("cuda") and torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name()
        info["cuda"] = torch.version.cuda
        try:
            import subprocess
            info["driver"] = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                            capture_output=True, text=True, timeout=10).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            info["driver"] = None
    info["label"] = (f"{info['gpu']}" if info["gpu"] else f"{info['cpu']} ({info['cpu_cores']} cores)")
    return info
