"""Where a run is launched: this machine (torchrun, warm agent), several nodes, Slurm (submitit), and the run lock and process lifetime they share."""
