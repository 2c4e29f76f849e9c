"""Where a run is launched: the launch interface and its backends (this machine, nodes, Slurm),
the run lock and the process lifetime they share."""
