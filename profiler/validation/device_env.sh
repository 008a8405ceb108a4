#!/usr/bin/env bash
# Source on the GPU machine from the repository root: the tlora_sim import package over this
# checkout (/tmp/ns), simpy from .device_carry/wheels (the one dependency the image lacks),
# NVLink multicast off, the allocator the validations ran with, and device provenance in $OUT.
mkdir -p /tmp/ns/tlora_sim "$OUT"
for p in sim policies traces profiler; do ln -sfn "$PWD/$p" /tmp/ns/tlora_sim/$p; done
ln -sfn "$PWD/sim/api/__init__.py" /tmp/ns/tlora_sim/__init__.py
export PYTHONPATH=/tmp/ns:/tmp/pydeps:$PWD PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
python3 -c "import simpy" 2>/dev/null || pip install -q --no-index --no-deps \
  --find-links .device_carry/wheels --target /tmp/pydeps simpy
{ nvidia-smi --query-gpu=name,driver_version,memory.total,uuid --format=csv
  python3 -c "import torch, triton, sys; print('torch', torch.__version__, 'triton', triton.__version__, 'python', sys.version.split()[0])"
  grep -m1 'model name' /proc/cpuinfo; nproc; hostname
  echo "commit $(git rev-parse HEAD 2>/dev/null || echo unknown)"; date -u +%FT%TZ; } > "$OUT/device.txt" 2>&1
