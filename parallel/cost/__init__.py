"""The torch-free cost model: what a run costs before it runs.

- params: parameter shapes and counts, where each lives under a layout (tp-local, FSDP shards)
- flops: FLOPs per token (and the convention: full or causal attention term)
- activations: bytes kept for backward (per block, recompute policy, pipeline in flight)
- memory: bytes per rank by kind (parameters, gradients, optimizer state, weight copies,
  activations)
- devices: the device catalogue (dense peaks, memory per GPU) and GIB
- fit: does the fullest rank fit its device (the verdict plan, dry run and sweep preview show)
- step_time: step and run time at an assumed MFU
- plan: the Plan the dry run, `meshrun plan` and the sweep preview show

Nothing here imports torch: the dry run and the sweep preview call it for every point.
"""
