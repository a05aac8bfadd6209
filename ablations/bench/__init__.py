"""Benchmarks: speed and memory of attention backends and layers, and of cached generation.

measure.py   what is timed and how: `Workload`, interleaved medians, peak memory in a fresh
             process, `measure` (a table per suite, ratios to baselines of the same run)
suites.py    the suites (softmax, relational, dual, mechanisms, generation, ...), their
             defaults and titles, and `run_bench` (what ``attn-zoo bench`` does)
masks.py     the masks suite's kernels: local masks as mask mods against dense masks
gpu.py       the gpu suite's kernels and its measuring within a time budget, rows skipped
             with why where this machine lacks what they need
report.py    `write_bench_report`: report.md, index.html, CSVs and plots of any suites
"""

# The CLI's choices (defined here so that `attn-zoo --help` imports neither torch nor pandas)
SUITES = ("softmax", "relational", "dual", "mechanisms")  # the default; and "generation"
DTYPES = ("bfloat16", "float16", "float32")
GPU_BUDGET = 330.0  # the gpu suite's seconds: within 8 minutes with start-up and the report
