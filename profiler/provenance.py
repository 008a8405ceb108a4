"""Provenance of every profile row (GPU, driver, CUDA, torch and triton versions, git commit,
kernel hash, profile id) and the CSV writer that stamps it on each row, flushing as it goes so a
partial run keeps its data. Shared by the single-GPU profile, the end-to-end run and the
multi-GPU profile."""
from __future__ import annotations

import csv
import datetime as _dt
import hashlib
import os
import platform
import subprocess
import time
import zlib
from pathlib import Path



ROOT = Path(__file__).resolve().parent.parent

COLUMNS = ["kind", "model", "plan", "impl", "n_adapters", "ranks", "batch_sizes", "seq_lens", "tokens",
           "params", "tensors", "layers", "fwd_ms", "bwd_ms", "opt_ms", "step_ms", "p10_ms", "p90_ms", "reps", "host_ms",
           "saved_bytes", "peak_bytes", "static_bytes", "error",
           "gpu", "gpu_name", "driver", "cuda", "torch", "triton", "kernel_variant", "git_commit", "git_dirty",
           "profile_id", "mode", "timestamp"]



# ----------------------------------------------------------------------------------- provenance
def short_gpu_name(name: str) -> str:
    """``NVIDIA H100 80GB HBM3`` -> ``H100``; CPU -> ``CPU``; unknown -> sanitized name."""
    for k in ("H200", "H100", "A100", "L40S", "B200", "GH200"):
        if k in name.upper():
            return k
    return "".join(c for c in name if c.isalnum())[:24] or "GPU"


def kernel_hash() -> str:
    """sha1 (12 hex) of the fused kernel sources (profiler/kernels/*.py), the kernel variant."""
    h = hashlib.sha1()
    for p in sorted((ROOT / "profiler" / "kernels").glob("*.py")):
        h.update(p.name.encode())
        h.update(p.read_bytes())
    return h.hexdigest()[:12]


def git_commit() -> tuple[str, str]:
    """(commit, dirty flag) from TLORA_GIT_COMMIT / TLORA_GIT_DIRTY or git; 'unknown' without."""
    c = os.environ.get("TLORA_GIT_COMMIT")
    if c:
        return c, os.environ.get("TLORA_GIT_DIRTY", "unknown")
    try:
        c = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=10)
        d = subprocess.run(["git", "status", "--porcelain"], cwd=ROOT, capture_output=True, text=True, timeout=10)
        if c.returncode == 0:
            return c.stdout.strip(), "1" if d.stdout.strip() else "0"
    except Exception:
        pass
    return "unknown", "unknown"


def provenance(device: str, gpu_name: str = "auto", mode: str = "quick") -> dict:
    import torch

    try:
        import triton

        tv = triton.__version__
    except Exception:
        tv = "none"
    if torch.device(device).type == "cuda":
        full = torch.cuda.get_device_name(0)
        drv = ""
        try:
            drv = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                 capture_output=True, text=True, timeout=20).stdout.strip().splitlines()[0]
        except Exception:
            pass
    else:
        full, drv = f"CPU {platform.processor() or platform.machine()}", ""
    short = ("CPU" if torch.device(device).type == "cpu" else short_gpu_name(full)) if gpu_name in ("auto", "", None) else gpu_name
    commit, dirty = git_commit()
    now = _dt.datetime.now(_dt.timezone.utc)
    pid = f"{short.lower()}-{now.strftime('%Y%m%dT%H%M%S')}-{zlib.crc32(platform.node().encode()) & 0xffff:04x}"
    return {"gpu": short, "gpu_name": full, "driver": drv, "cuda": torch.version.cuda or "", "torch": torch.__version__,
            "triton": tv, "git_commit": commit, "git_dirty": dirty, "profile_id": pid, "mode": mode,
            "kernel_hash": kernel_hash()}


def variant(impl: str, prov: dict) -> str:
    return {"fused": f"tlora-triton@{prov['kernel_hash']}", "loop": "torch-eager-loop",
            "padded": "torch-padded-bmm(fallback for fused)", "none": "frozen-base"}.get(impl, impl)


class Writer:
    """Appends rows to a CSV (header once) and flushes each, so partial runs keep their data."""

    def __init__(self, path: Path, prov: dict):
        self.path, self.prov = Path(path), prov
        self.path.parent.mkdir(parents=True, exist_ok=True)
        new = not self.path.exists() or self.path.stat().st_size == 0
        self.f = open(self.path, "a", newline="")
        self.w = csv.DictWriter(self.f, fieldnames=COLUMNS, extrasaction="ignore")
        if new:
            self.w.writeheader()
        self.n = 0

    def row(self, **kw):
        r = {k: self.prov.get(k, "") for k in COLUMNS}
        r["timestamp"] = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
        for k, v in kw.items():
            r[k] = f"{v:.6g}" if isinstance(v, float) else v
        self.w.writerow(r)
        self.f.flush()
        self.n += 1

    def close(self):
        self.f.close()


def log(msg: str):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)
