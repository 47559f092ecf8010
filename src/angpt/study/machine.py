"""Provenance for the report: the machine the runs ran on and a summary of the dataset."""

from __future__ import annotations

import os
import platform
import time
from typing import Any


def machine_info(dtype: str = "auto", device: str = "auto") -> dict[str, Any]:
    """Versions, host, CPU and GPU, and the compute dtype `dtype` resolves to here: what judges step times."""
    import torch

    import angpt
    from angpt.errors import ConfigError
    from angpt.train.dist import pick_device
    from angpt.train.hardware import cpu_bf16_summary, cpu_info
    from angpt.train.step import resolve_dtype

    cpu = cpu_info().get("model name") or platform.processor() or platform.machine()
    try:
        here = pick_device(device)
    except ConfigError:  # a report of runs made on a device this machine lacks (a GPU's, read on a CPU)
        here = pick_device("auto")
    gpu = None
    if torch.cuda.is_available():
        gpu = ", ".join(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count()))
    from angpt.train.provenance import git_revision

    return {
        "dtype": resolve_dtype(dtype, here),  # what the runs used: "auto" resolved on this machine
        "angpt_version": angpt.__version__,
        "torch_version": torch.__version__,
        "python_version": platform.python_version(),
        "git_revision": git_revision(),
        "hostname": platform.node(),
        "platform": platform.platform(),
        "cpu": cpu,
        "cpu_cores": os.cpu_count(),
        **cpu_bf16_summary(),
        "gpu": gpu,
        "date": time.strftime("%Y-%m-%d %H:%M:%S %z"),
    }


def dataset_summary(meta: dict | None) -> dict[str, Any]:
    """Tokenizer, vocabulary, split sizes and source of the dataset's meta (empty when it is unavailable)."""
    if meta is None:
        return {}
    splits = meta.get("splits", {})
    return {
        "tokenizer": meta.get("tokenizer", {}).get("spec"),
        "vocab_size": meta.get("vocab_size"),
        "train_tokens": splits.get("train", {}).get("tokens"),
        "val_tokens": splits.get("val", {}).get("tokens"),
        "val_documents": splits.get("val", {}).get("documents"),
        "test_tokens": splits.get("test", {}).get("tokens"),
        "test_documents": splits.get("test", {}).get("documents"),
        "source": meta.get("source"),
    }
