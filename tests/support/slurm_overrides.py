"""Overrides for tiny runs on the local Slurm test cluster (tests/slurm/cluster.py): its nodes
have no GPUs and names that do not resolve (so the rendezvous is 127.0.0.1), and a warning
signal early enough for a 10-minute time limit."""
from __future__ import annotations

import sys

TINY = ["model=tiny", "training.seq_len=64", "training.micro_batch_size=4", "logging=offline",
        "training.eval_every=10", "schedule.warmup_steps=2", "cluster.preflight_max_mib=4"]
SLURM = ["cluster=slurm", "cluster.gpus_per_node=0", "cluster.procs_per_node=2",
         "cluster.rdzv_host=127.0.0.1", "cluster.time_limit_min=10",
         "cluster.warning_signal=USR1@30", f"cluster.python={sys.executable}"]
