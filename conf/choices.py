"""The choices of the config's enumerated knobs, as `StrEnum`s (omegaconf 2.3 rejects
`Literal`): they compare equal to, and print as, their values. conf/schema.py uses them for
its fields and re-exports them; each knob is documented there."""
from __future__ import annotations

from enum import StrEnum


class Precision(StrEnum):
    auto = "auto"
    fp32 = "fp32"
    bf16 = "bf16"
    fp16 = "fp16"
    fp8 = "fp8"


class DType(StrEnum):
    fp32 = "fp32"
    bf16 = "bf16"
    fp16 = "fp16"


class RecomputeMode(StrEnum):
    none = "none"
    full = "full"
    selective = "selective"
    offload = "offload"


class RecomputeTarget(StrEnum):
    """What recompute.mode=selective re-runs in backward (`recompute.targets`): the one list
    the rules (conf/rules/split_rules.py), the pass (parallel/recompute.py) and the cost model
    (parallel/cost/activations.py) read; each model family maps a target to its submodules."""
    ops = "ops"
    swiglu = "swiglu"
    norm = "norm"
    attention = "attention"
    ffn = "ffn"
    block = "block"


class OpsMatmuls(StrEnum):
    """Which matmul outputs the selective `ops` policy keeps (`recompute.ops_matmuls`)."""
    all = "all"
    alternate = "alternate"


class ScheduleKind(StrEnum):
    constant = "constant"
    linear = "linear"
    cosine = "cosine"
    wsd = "wsd"


class DecayShape(StrEnum):
    linear = "linear"
    cosine = "cosine"
    one_minus_sqrt = "one_minus_sqrt"


class CompileBackend(StrEnum):
    inductor = "inductor"
    aot_eager = "aot_eager"
    eager = "eager"


class DataKind(StrEnum):
    stdlib = "stdlib"
    files = "files"
    synthetic = "synthetic"


class ClusterKind(StrEnum):
    local = "local"
    slurm = "slurm"
    nodes = "nodes"


class DeviceKind(StrEnum):
    auto = "auto"
    cpu = "cpu"
    cuda = "cuda"


class RopeScaling(StrEnum):
    none = "none"
    llama3 = "llama3"


class RouterScore(StrEnum):
    softmax = "softmax"
    sigmoid = "sigmoid"


class NonFinite(StrEnum):
    stop = "stop"
    skip_step = "skip_step"


class CpuPeakMode(StrEnum):
    host = "host"
    remeasure = "remeasure"
    run = "run"


class WandbMode(StrEnum):
    offline = "offline"
    online = "online"
    disabled = "disabled"


class MuonLrScale(StrEnum):
    """torch.optim.Muon's adjust_lr_fn names (optim.muon_lr_scale)."""
    match_rms_adamw = "match_rms_adamw"
    original = "original"
