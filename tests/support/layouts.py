"""The layouts the parity tests prove against one process, by world size (override lists).

One list: tests/distributed/test_layout_parity.py runs them all; the activation-memory test
measures the ones without a pipeline or a recompute override of their own."""

TWO_RANKS = {
    "ddp": ["parallel=ddp"],
    "zero1": ["parallel=zero1"],
    "zero2": ["parallel=zero2"],
    "zero3": ["parallel=zero3"],
    "tp_sp": ["parallel=tp"],
    "tp_no_sp": ["parallel=tp", "parallel.sequence_parallel=false"],
    "tp_loss_parallel": ["parallel=tp", "parallel.loss_parallel=true"],
    "cp_balanced": ["parallel=cp"],
    "cp_contiguous": ["parallel=cp", "parallel.cp_balanced=false"],
    "cp_recompute_attention": ["parallel=cp", "recompute=selective_attention"],
    "ddp_loss_chunks": ["parallel=ddp", "training.loss_chunks=3"],  # uneven row blocks
    "zero3_loss_chunks": ["parallel=zero3", "training.loss_chunks=4"],
    "cp_loss_chunks": ["parallel=cp", "training.loss_chunks=2"],
    "pp_1f1b": ["parallel=pp"],
    "pp_interleaved": ["parallel=pp", "parallel.pp_schedule=interleaved_1f1b",
                       "parallel.pp_virtual_stages=2", "parallel.pp_microbatches=2"],
}
FOUR_RANKS = {
    "hsdp_2x2": ["parallel=hsdp"],
    "dp2_tp2": ["parallel=fsdp_tp"],
    "cp2_tp2": ["parallel.dp_replicate=1", "parallel.cp=2", "parallel.tp=2", "parallel.zero=3"],
    "ddp2_cp2": ["parallel.dp_replicate=2", "parallel.cp=2"],
    "zero1_cp2": ["parallel.dp_replicate=1", "parallel.dp_shard=2", "parallel.zero=1",
                  "parallel.cp=2"],
    "pp2_dp2": ["parallel=pp", "parallel.pp=2", "parallel.dp_shard=-1", "parallel.zero=3"],
    "pp2_ddp2": ["parallel=pp", "parallel.pp=2", "parallel.dp_replicate=-1"],
    "pp2_tp2": ["parallel=pp", "parallel.pp=2", "parallel.tp=2"],
    "pp2_zero1_interleaved": ["parallel=pp", "parallel.pp=2", "parallel.dp_shard=-1",
                              "parallel.zero=1", "parallel.pp_schedule=interleaved_1f1b",
                              "parallel.pp_virtual_stages=2", "parallel.pp_microbatches=2"],
    "dp2_tp2_selective": ["parallel=fsdp_tp", "recompute=selective"],
    "pp2_dp2_full_every2": ["parallel=pp", "parallel.pp=2", "parallel.dp_shard=-1",
                            "parallel.zero=2", "recompute=full_every2"],
}
DP_TP = {
    "ddp2_tp2": ["parallel=ddp", "parallel.tp=2"],
    "zero1_dp2_tp2": ["parallel=zero1", "parallel.tp=2"],
    "ddp2_tp2_no_sp_loss_parallel": ["parallel=ddp", "parallel.tp=2",
                                     "parallel.sequence_parallel=false",
                                     "parallel.loss_parallel=true"],
}
"""DDP and ZeRO-1 over tp's DTensor shards (parallel/dp_tp_grads.py), 4 ranks: one launch of
their own (tests/distributed/test_layout_parity.py)."""
EIGHT_RANKS = {
    "pp2_dp2_tp2": ["parallel=3d"],
    "pp2_cp2_tp2": ["parallel=4d", "parallel.dp_shard=1"],
}
