"""Config: schema (Hydra-facing), frozen RunSpec, resolve() and its rules. Imports no torch."""
