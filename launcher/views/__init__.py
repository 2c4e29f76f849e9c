"""What the console shows: the plan and rank tables, live progress, a run's summary and status."""
