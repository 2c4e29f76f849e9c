"""The run-dir contract, torch-free and hydra-free: what a run dir and its checkpoints hold,
under which names, and how to read them. The launcher writes run dirs, the ranks fill them,
`meshrun status`, `compare` and the sweeps read them; all of them name the files through here.

- `paths`: every file name in a run dir, and `RunDir`, its paths by name.
- `metrics_rows`: metrics.jsonl's row kinds and events, and its reader (resume markers applied).
- `outcomes`: summary.json's numbers, from metrics rows.
- `failure_diagnosis`: why a run failed (the first failing rank, the log tail worth showing,
  a full disk, out of memory).
- `run_states`: one vocabulary of run states, and the state a run dir's files say.
- `checkpoint_dirs`: checkpoint folder names and THE complete-checkpoint rule.
- `checkpoint_verify`: is a checkpoint intact and safe to load (checksums, DCP metadata scan).
- `spec_io`: RunSpec <-> spec.json (what every rank reads).
- `preflight_report`: preflight.json as text.
"""
