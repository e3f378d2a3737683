"""Which GPU(s) a barrier task may use: Spark's assignment, seen through CUDA_VISIBLE_DEVICES."""
from __future__ import annotations

import sys
from pathlib import Path

from sparkddl.errors import ClusterError


def map_gpu_addresses(addresses: list[str], visible: str | None) -> list[str]:
    """Translate Spark's GPU addresses into the values CUDA_VISIBLE_DEVICES should hold.

    When the executor already restricts the devices it sees (YARN, Kubernetes and some
    resource managers pre-set CUDA_VISIBLE_DEVICES), Spark's addresses are indices into
    that list rather than physical ids, so they are mapped through it.
    """
    if not visible:
        return list(addresses)
    allowed = [d.strip() for d in visible.split(",") if d.strip()]
    mapped = []
    for addr in addresses:
        if not addr.isdigit() or int(addr) >= len(allowed):
            raise ClusterError(
                f"Spark assigned GPU address {addr!r} but CUDA_VISIBLE_DEVICES={visible!r} only "
                f"exposes {len(allowed)} device(s); make the GPU discovery script report indices "
                "into CUDA_VISIBLE_DEVICES, or unset it on the executors.")
        mapped.append(allowed[int(addr)])
    return mapped


def write_discovery_script(path: "str | Path", python: str = sys.executable) -> Path:
    """Write a Spark GPU discovery script at ``path`` that reports the GPUs torch sees on
    the machine it runs on (``{"name": "gpu", "addresses": ["0", ...]}``), for
    ``spark.{worker,executor}.resource.gpu.discoveryScript``; ``python`` must have torch."""
    path = Path(path)
    path.write_text(
        "#!/bin/sh\n# Spark GPU discovery: the devices torch sees here\n"
        f"exec {python} -c 'import json, torch; print(json.dumps({{\"name\": \"gpu\", "
        "\"addresses\": [str(i) for i in range(torch.cuda.device_count())]}))'\n")
    path.chmod(0o755)
    return path
