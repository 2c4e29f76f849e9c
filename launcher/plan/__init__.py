"""The numbers of a run: `meshrun plan` as JSON, the layout search, calibration and fit advice."""
