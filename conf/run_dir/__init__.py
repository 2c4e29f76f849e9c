"""The run-dir contract, torch-free: what a run dir and its checkpoints hold, under which names,
and how to read them. The launcher writes run dirs, the ranks fill them, `meshrun status`,
`compare` and the sweeps read them; all of them name the files through this package.

- `checkpoint_dirs`: checkpoint folder names and THE complete-checkpoint rule.
- `checkpoint_verify`: is a checkpoint intact and safe to load (checksums, DCP metadata scan).
- `spec_io`: RunSpec <-> spec.json (what every rank reads).
- `preflight_report`: preflight.json as text.
"""
