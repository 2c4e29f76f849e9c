"""Where each parallelism lives: its degrees, its pass, its rules and its cost terms.

Adding a parallelism starts here. Its degree (if it brings one) goes into conf/degrees.py
(schema key, mesh axis, mesh position; the knob itself into conf/schema.py); then its pass
(a module of parallel/, applied in order by training/parallel_model.py `_parallelize_part`),
its rules (conf/rules/, called by resolve() and by `plan --search`) and its cost terms
(parallel/cost/: communication, memory, step time). Name them all in a row of PARALLELISMS;
tests/unit/test_parallelisms.py keeps every name true (each module imports, each attribute
exists) and every degree covered.

Torch-free: the places are data, `"module:attribute"`, imported only by that test.
"""
from __future__ import annotations

from dataclasses import dataclass

APPLIED_BY = "training.parallel_model:_parallelize_part"
"""Where the passes are applied to a model part, in order (pipeline split first, FSDP or DDP
last)."""


@dataclass(frozen=True, slots=True)
class Parallelism:
    """One parallelism: what it splits, over which degrees, and where its code is."""

    name: str
    degrees: tuple[str, ...]
    """The degrees (conf/degrees.py) whose ranks it runs over."""
    when: str
    """The knobs that turn it on."""
    passes: tuple[str, ...]
    """Its pass: the torch code that applies it ("module:attribute")."""
    rules: tuple[str, ...]
    """The rules that check it (conf/rules/)."""
    cost: tuple[str, ...]
    """Its terms in the cost model (parallel/cost/)."""


PARALLELISMS = (
    Parallelism(
        name="ddp", degrees=("dp_replicate", "dp_shard", "cp"),
        when="parallel.zero 0 or 1 with dp x cp > 1 (ParallelSpec.uses_ddp); under tp the "
             "gradients' tp shards averaged without DDP",
        passes=("parallel.data_parallel:apply_ddp", "parallel.data_parallel:gradient_sync",
                "parallel.dp_tp_grads:ShardGradAverage"),
        rules=("conf.rules.parallel_rules:check_zero", "conf.rules.training_rules:resolve_batch"),
        cost=("parallel.cost.comm:_data_parallel", "parallel.cost.step_time:optimizer_params")),
    Parallelism(
        name="zero1", degrees=("dp_shard",),
        when="parallel.zero=1 (optimizer state sharded over dp_shard, on top of DDP)",
        passes=("parallel.zero1:Zero1Partition", "parallel.dims:zero1_owners"),
        rules=("conf.rules.parallel_rules:check_zero",),
        cost=("parallel.cost.memory_static:zero1_shares", "parallel.cost.comm:_data_parallel",
              "parallel.cost.step_time:optimizer_params")),
    Parallelism(
        name="fsdp", degrees=("dp_replicate", "dp_shard", "cp"),
        when="parallel.zero 2 or 3 (ParallelSpec.uses_fsdp); HSDP with dp_replicate > 1",
        passes=("parallel.fsdp:apply_fsdp", "parallel.mesh:fsdp_mesh"),
        rules=("conf.rules.parallel_rules:check_zero",),
        cost=("parallel.cost.params:fsdp_local_numel", "parallel.cost.comm:_data_parallel",
              "parallel.cost.step_time:optimizer_params")),
    Parallelism(
        name="tp", degrees=("tp",),
        when="parallel.tp > 1; parallel.sequence_parallel, parallel.loss_parallel",
        passes=("parallel.tensor_parallel:apply_tp", "parallel.tp_plan:tp_split_dim", "training.models.family:TpPlan",
                "parallel.tied_embeddings:TiedHeadParallel", "parallel.float8_tp:float8_paths",
                "parallel.tp_replicated:sum_over_tp"),
        rules=("conf.rules.split_rules:check_tensor_parallel",
               "conf.rules.split_rules:check_sequence_split",
               "conf.rules.parallel_rules:check_zero"),
        cost=("parallel.cost.comm:_tensor_parallel", "parallel.cost.comm:tp_gather_bytes",
              "parallel.cost.params:tp_local_shape",
              "parallel.cost.activations:ActivationSplit")),
    Parallelism(
        name="pp", degrees=("pp",),
        when="parallel.pp > 1; parallel.pp_schedule, pp_virtual_stages, pp_microbatches, "
             "pp_layer_split",
        passes=("parallel.pipeline:split_model", "parallel.pipeline:build_schedule",
                "parallel.tied_embeddings:find_tied_copy"),
        rules=("conf.rules.parallel_rules:check_pipeline_options",
               "conf.rules.split_rules:check_pipeline_split", "conf.rules.split_rules:stage_split"),
        cost=("parallel.cost.comm:_pipeline", "parallel.cost.step_time:bubble_factor",
              "parallel.cost.activations:pipeline_in_flight", "parallel.cost.params:held_layers")),
    Parallelism(
        name="cp", degrees=("cp",),
        when="parallel.cp > 1; parallel.cp_balanced",
        passes=("parallel.context_parallel:apply_context_parallel",
                "parallel.context_parallel:shard_positions"),
        rules=("conf.rules.split_rules:check_sequence_split",
               "conf.rules.compile_rules:check_compile"),
        cost=("parallel.cost.comm:_context_parallel", "parallel.cost.activations:ActivationSplit")),
    Parallelism(
        name="ep", degrees=("dp_shard", "cp"),
        when="parallel.ep > 1 (MoE models; borrows its ranks from dp_shard x cp); "
             "parallel.ep_imbalance for the plan (0: fitted by plan --calibrate)",
        passes=("parallel.expert_parallel:apply_ep", "parallel.mesh:expert_meshes",
                "parallel.fsdp:shard_experts_units"),
        rules=("conf.rules.expert_rules:check_expert_parallel",),
        cost=("parallel.cost.comm:_expert_parallel", "parallel.cost.comm:all_to_all_bytes",
              "parallel.cost.params:sharded_numel", "parallel.cost.search_space:ep_degrees",
              "parallel.cost.routing_fit:fit_imbalance")),
)
