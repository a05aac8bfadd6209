"""Ablation grids over (mechanism x size x task x seed): specs, tasks, training, store, reports."""
