"""The `meshrun` command: compose, plan, launch and follow training runs."""
