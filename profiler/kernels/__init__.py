"""Fused multi-LoRA Triton kernels (forward + backward) and the baselines they are measured
against. Importing this package needs torch and triton; nothing outside ``profiler`` imports it.
This file is the package's API: the names of ``__all__``, each imported from the module that
defines it."""
from .multilora import MultiLoRALinear, dropout_keep_mask_triton, multi_lora_linear
from .config import KernelConfig, keep_threshold, mix_seed
from .plan import LoRAPlan, build_plan
from .reference import keep_mask, reference_forward_backward

__all__ = ["KernelConfig", "LoRAPlan", "MultiLoRALinear", "build_plan", "dropout_keep_mask_triton", "keep_mask",
           "keep_threshold", "mix_seed", "multi_lora_linear", "reference_forward_backward"]
