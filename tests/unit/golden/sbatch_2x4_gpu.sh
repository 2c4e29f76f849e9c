#!/bin/bash

# Parameters
#SBATCH --account=team-a
#SBATCH --constraint=h100
#SBATCH --cpus-per-task=8
#SBATCH --error=<RUN_DIR>/slurm/%j/%j_0_log.err
#SBATCH --exclusive
#SBATCH --gpus-per-node=4
#SBATCH --job-name=meshrun-llama3_1b-20260101-000000
#SBATCH --mail-type=END
#SBATCH --mem=480GB
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=4
#SBATCH --open-mode=append
#SBATCH --output=<RUN_DIR>/slurm/%j/%j_0_log.out
#SBATCH --partition=gpu
#SBATCH --qos=high
#SBATCH --requeue
#SBATCH --reservation=big
#SBATCH --signal=USR1@120
#SBATCH --time=120
#SBATCH --wckey=submitit

# setup
module load cuda/12.4
source /opt/venv/bin/activate

# command
export SUBMITIT_EXECUTOR=slurm
srun --unbuffered --output <RUN_DIR>/slurm/%j/%j_%t_log.out --error <RUN_DIR>/slurm/%j/%j_%t_log.err '--container-image=nvcr.io#nvidia/pytorch:24.05-py3' --container-mounts=/data:/data <PYTHON> -u -m submitit.core._submit <RUN_DIR>/slurm/%j
