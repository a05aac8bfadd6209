"""The results stage: what runs leave behind. store.py (the SQLite store every cell is claimed in
and finished to; its grids table: each grid's axes, axes.py), frames.py (its cells as one pandas
table), cells_file.py (a report's cells.csv read back as a store), tracking.py (TensorBoard, MLflow
and W&B logs of each cell)."""
