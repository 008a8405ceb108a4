"""helper 27: the two-launch path at other token counts and ranks (mixes not in bench/kernels.py)."""
import os
import sys
sys.path.insert(0, os.getcwd())
from bench import kernels as KB  # noqa: E402
KB.MIXES.update({"t1024": ([2, 4, 8, 16], [256] * 4), "r64x2": ([64, 128], [256, 256]),
                 "r256": ([16, 256], [256, 256]), "t2x96": ([8, 32], [96, 96])})
from bench import kernel_profile as P  # noqa: E402
P.main(["--precompile", "8", "--steps", "2", "--replays", "20", "--cases",
        os.environ.get("XCASES", "4096x4096:t1024,4096x4096:r64x2,4096x4096:r256,4096x4096:t2x96"),
        "--configs", '[{"tiny_tokens": 0}, {"tiny_tokens": 1024}]', "--dropout", "0.1",
        "--out", "/tmp/w27/extra.json"])
