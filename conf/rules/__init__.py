"""The cross-field rules resolve() (conf/resolve.py) checks, one file per concern.

Every rule adds a Problem to the run's ProblemList and none raises, so a user sees all of them
at once. Torch-free and Hydra-free, like all of conf/; `plan --search` (parallel/cost/
search_space.py) asks the same functions, so no rule is restated there.

- field_rules.py       single knobs of every section by type: finite floats, flat lists, positives
- model_rules.py       the model shape (heads, RoPE scaling); the precision against the device
- parallel_rules.py    the degrees (one auto, product = world size), the ZeRO stage, pipeline options
- split_rules.py       the model, sequence, batch and loss split over the degrees; recompute targets
- compile_rules.py     per-block torch.compile against context parallel and recompute
- training_rules.py    the batch (micro x accumulation x dp), the loop's knobs, schedule, optimizer
- profile_rules.py     the profiler window and ranks, CUDA memory snapshots (refused on CPU)
- cluster_rules.py     nodes and processes against the host, step-time knobs, Slurm / nodes launch
- checkpoint_rules.py  checkpointing, and the run dir or checkpoint resumed from or loaded
- data_rules.py        raw token files (data=files): globs and token dtype
- document_rules.py    the document mask's end-of-document id
- name_rules.py        W&B names and tags, run and output folder names
- eval_rules.py        the eval section: multiple-choice task files (conf/eval_tasks.py), cadence

Rules that read a file format live beside the code that owns that format, and resolve() calls
them too: a Hugging Face config.json (conf/hf_model_config.py), prepared data, data sources
and the tokenizer (conf/data_contract/prepared_corpus.py), the contents of token files (conf/data_contract/token_files.py).
"""
