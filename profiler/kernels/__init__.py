"""Fused multi-LoRA Triton kernels (forward + backward) and the baselines they are measured
against. Importing this package needs torch and triton; nothing outside ``profiler`` imports it."""
from .multilora import (KernelConfig, LoRAPlan, MultiLoRALinear, build_plan,  # noqa: F401
                        dropout_keep_mask_triton, keep_threshold, mix_seed, multi_lora_linear)
from .reference import keep_mask, reference_forward_backward  # noqa: F401
