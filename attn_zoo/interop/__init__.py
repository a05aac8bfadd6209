"""Interop with other attention packages: port their modules and checkpoints to ours, run our
kernels as transformers attention implementations (transformers.py), and put our mechanisms
into transformers models (surgery.py)."""
