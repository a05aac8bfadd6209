"""The report stage: a store's (or a report's cells.csv's) cells read into tables, statistics,
figures and two pages (report.md, index.html), written into a folder whole or not at all.

build.py (`write_report`, the page in order), tables.py, figures.py, sections.py (one builder
per task section), selection.py (selection and statistics) and selection_section.py (its
section), attention_maps.py, provenance.py (what the report was built from), pages.py (the
page model and its templates), folder.py (the atomic folder swap)."""
