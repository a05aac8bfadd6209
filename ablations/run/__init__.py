"""The run stage: cells claimed from a store and trained by an executor, resumable.

runner.py (claim, submit, collect), executors.py (local processes, Ray), train.py (one cell),
resume.py (mid-cell checkpoints), devices.py (where a cell runs), progress.py and status.py
(what a run prints), search.py (Optuna), provenance.py (what a result depends on)."""
