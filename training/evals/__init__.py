"""Downstream evals scored by log-likelihood: multiple-choice tasks (conf/eval_tasks.py) during
training (`eval.tasks`) and on a finished run or export (`meshrun eval`, through lm-eval)."""
