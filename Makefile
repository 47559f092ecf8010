# Two entry points: `make demo` (the main job) and `make test`. Both create .venv themselves.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
DATA   ?= data/stdlib-bpe4096
OUT    ?= runs/demo
export HF_HUB_OFFLINE ?= 1
export HF_DATASETS_OFFLINE ?= 1
export TOKENIZERS_PARALLELISM ?= false

.PHONY: install demo train-demo test test-slow test-slurm slurm-up slurm-down test-compat lint format bench constraints clean

install: $(STAMP)

# torch goes in first and alone: pip resolving torch itself would pull a CUDA build of several GB.
$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -c constraints.txt -e ".[hf,eval,plot,log,dev,scaling]"
	touch $(STAMP)
	@echo "installed into $(VENV): the command line is $(BIN)/angpt (or: source $(BIN)/activate; angpt --help)"

# The main job: GPT+ and anGPT side by side, 1,000 optimizer steps each (1M tokens, a 4-layer d=128 model), both
# trained at once on two cores (5 min from a fresh clone on a quiet 2-core machine, install included;
# benchmarks/RESULTS.md). One seed at the recipes' learning rates: a demonstration that both learn, not evidence
# (see benchmarks/ for that). One learning rate, so nothing is selected: --tuning-seed none trains each arm once
# instead of twice.
# The report ends with the loss curves, the difference and a text sample from each model. Re-running resumes.
demo: $(STAMP)
	$(BIN)/angpt prepare --source stdlib --tokenizer bpe:4096 --val-fraction 0.02 --out $(DATA) --quiet
	$(BIN)/angpt compare --data $(DATA) --out $(OUT) --arms gpt+,angpt --baseline gpt+ \
		--budgets 1000Ki --seeds 0 --lr-grid 1 --tuning-seed none --preset demo \
		--set model.d_model=128 model.n_layers=4 model.n_heads=2 model.context_length=128 \
		--batch-tokens 1024 --seq-len 128 --micro-batch 8 --eval-batches 16 --eval-points 20 \
		--jobs 2 --threads 1 --sample "def main(" --sample-tokens 80
	@cat $(OUT)/report.md
	@echo ""
	@echo "Next: source $(VENV)/bin/activate, then angpt prepare --source YOUR_TEXT/ --out data/mine and"
	@echo "angpt train --config configs/demo-angpt.yaml --data data/mine --out runs/mine (README: 'Your own text')."

train-demo: $(STAMP)
	$(BIN)/angpt prepare --source stdlib --tokenizer bpe:4096 --val-fraction 0.02 --out $(DATA) --quiet
	$(BIN)/angpt train --config configs/demo-angpt.yaml --data $(DATA) --out runs/train-demo --resume auto

# `make test`: ruff and every test but the slow end-to-end ones and the Slurm ones (pytest 10 min 22 s on 2 quiet cores
# with the venv made: 1,174 tests, cpu2f, 2026-11-29); `make test-slow` runs the slow ones (~10 min; CI runs both).
test: $(STAMP)
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/ruff format --check src tests benchmarks
	$(BIN)/pytest -q -m "not slow and not slurm"

test-slow: $(STAMP)
	$(BIN)/pytest -q -m "slow and not slurm"

# Studies on Slurm (issue 47), against a real one-node Slurm on this machine (scripts/slurm.sh: Debian's slurm-wlm and
# munge, no cgroups; needs root or sudo). `make test-slurm` starts it and runs the tests marked slurm (~3 min; CI
# runs them: .ci/run); `make slurm-down` stops it.
slurm-up:
	bash scripts/slurm.sh up

slurm-down:
	bash scripts/slurm.sh down

test-slurm: $(STAMP) slurm-up
	$(BIN)/pytest -q -m slurm

# The tests at our seams to outside libraries (transformers, lm-eval, datasets, tokenizers, torch.compile, DDP/FSDP2)
# in throwaway venvs with the newest releases within our ranges and with the oldest we declare; prints a table.
# LEGS=newest runs one leg (CI does, on every submission). Needs the package registry; ~4 min a leg on 2 cores.
LEGS ?= newest oldest
test-compat:
	$(PYTHON) .ci/compat.py $(LEGS)

lint format: $(STAMP)
	$(BIN)/ruff check --fix src tests benchmarks
	$(BIN)/ruff format src tests benchmarks

bench: $(STAMP)
	$(BIN)/angpt bench step --arch gpt+,ngpt,angpt --preset demo

constraints: $(STAMP)
	{ echo "# Pinned versions for reproducible installs (pip install -c constraints.txt ...)."; \
	  echo "# Regenerate with: make constraints"; \
	  $(BIN)/pip freeze | grep -v '^-e \|^angpt' | sed 's/^torch==\([0-9.]*\)+.*/torch==\1/'; } > constraints.txt

clean:
	rm -rf $(VENV) .venv-compat .pytest_cache .ruff_cache
