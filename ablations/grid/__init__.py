"""The grid stage: a grid file (TOML or Python) validated by its pydantic schema, expanded into
cells (task x size x mechanism x seed x swept settings), with its plugins imported.

schema.py (the file format and its defaults), spec.py (`load_grid`: reading, then
overrides.py, validate.py, expand.py and search_space.py), cell.py (one cell and its key),
cell_model.py and references.py (the model a cell trains), plugins.py, devices.py (what a grid
may name), reference.py (the generated key reference)."""
