"""``python -m experiments.reproduce``: every claim of the source papers this machine can test, measured, set
beside the paper's figure in ``results/REPORT.md`` (docs/reproduce.md)."""
