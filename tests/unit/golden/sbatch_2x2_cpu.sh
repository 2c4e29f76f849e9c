#!/bin/bash

# Parameters
#SBATCH --error=<RUN_DIR>/slurm/%j/%j_0_log.err
#SBATCH --job-name=meshrun-llama3_1b-20260101-000000
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=2
#SBATCH --open-mode=append
#SBATCH --output=<RUN_DIR>/slurm/%j/%j_0_log.out
#SBATCH --requeue
#SBATCH --signal=USR1@120
#SBATCH --time=240
#SBATCH --wckey=submitit

# command
export SUBMITIT_EXECUTOR=slurm
srun --unbuffered --output <RUN_DIR>/slurm/%j/%j_%t_log.out --error <RUN_DIR>/slurm/%j/%j_%t_log.err <PYTHON> -u -m submitit.core._submit <RUN_DIR>/slurm/%j
