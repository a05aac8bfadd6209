"""Interop with other attention packages: port their modules and checkpoints to ours."""
