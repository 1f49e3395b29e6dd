# The two set-up commands of the README: `make demo` and `make test`. Everything they need is
# installed here, from the project's own files (no hand-installed tools).
VENV ?= .venv
PY := $(VENV)/bin/python
# Users bring their own CUDA build (pyproject declares ranges); these are the tested pins.
TORCH_PINS ?= torch==2.14.1 torchvision==0.29.1
export PIP_DISABLE_PIP_VERSION_CHECK = 1

.PHONY: demo test test-fast lint docs cluster-up cluster-down apiserver-up apiserver-down pods-up pods-down examples bench clean

# One pip call: the pins and the package in one resolution (a second call resolves everything again).
$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q $(TORCH_PINS) -e '.[train,dev]'
	touch $@

demo: $(VENV)/.installed
	$(PY) -m dist_jobs.cli.demo

# The whole suite: system tools, the real SLURM cluster, the real kube-apiserver tier and the real
# pods on it (two kubelet nodes), then the test matrix of noxfile.py: everything on the venv's
# Python (`full`, which builds the docs site and opens it in headless Chromium:
# tests/integration/test_site.py), and every test that needs no torch on each other Python
# pyproject's classifiers promise (`torch_free`). Lint and the torch-free sessions run beside the full
# session at a lower priority (nice): the full session's time is mostly its workers waiting on
# cluster jobs, and the side work fills the cores then without slowing what it waits on. The full
# session's own processes yield too, a little (nice 3), to the jobs the cluster tiers run (started by
# slurmd and the kubelet at normal priority): the SLURM tests, one at a time, are its longest lane
# (the README's Tests section). The side work starts before the tiers come up: it needs none of
# them until the newest torch-free Python's apiserver tests, long after, and it fills the cores
# while the tiers' daemons start (the run is bound by its CPU work, so idle time is lost time).
# Its venvs are made first (nox --install-only; -R then runs the tests in them): a venv's pip
# runs on one core, so made late, once the full session is done, it would leave the other idle.
# The side work's output follows the full session's; either failing fails `make test`. The nice
# levels order this session's own processes: Linux's autogroup scheduling (on by default; the
# recipe prints it) first shares the CPU between sessions, and each SLURM step, pod and local rank
# is a session of its own. Lowering this session's own autogroup weight (nice 10 on
# /proc/self/autogroup) was measured: the full session then ended 4 minutes sooner, but the side
# work it starved ran after it, so `make test` took as long (it is bound by the CPU work), and
# the tests' own subprocesses (an export with a 60 s limit) ran out of time. So it is not done.
SIDE_LOG := build/test-side.log
# 3 SLURM nodes: the node-failure test needs one to spare for a 2-node job (its failed node is kept away).
SLURM_NODES := 3
# 4 CPUs a node (the nodes share this machine's cores): two of the tests' 2 x 2 jobs fit side by
# side, so a test can run its launch modes' jobs at once and wait on SLURM's timers once.
SLURM_CPUS := 4
test: $(VENV)/.installed
	command -v shellcheck >/dev/null && command -v chromium >/dev/null || \
	    (apt-get update -qq && apt-get install -y -qq -o DPkg::Lock::Timeout=600 shellcheck chromium)
	mkdir -p build
	@echo "make test: $$(nproc) cores, autogroup scheduling $$(cat /proc/sys/kernel/sched_autogroup_enabled 2>/dev/null || echo unknown)"
	( nice -n 10 $(VENV)/bin/nox -s torch_free --install-only && nice -n 10 $(MAKE) --no-print-directory lint && \
	    nice -n 10 $(VENV)/bin/nox -s torch_free -R ) \
	    > $(SIDE_LOG) 2>&1 & side=$$!; \
	DIST_JOBS_SLURM_NODES=$(SLURM_NODES) DIST_JOBS_SLURM_CPUS=$(SLURM_CPUS) bash slurm/cluster/up.sh && \
	bash k8s/apiserver/up.sh && DIST_JOBS_PODS_VENV=$(VENV) bash k8s/kubelet/up.sh && \
	DIST_JOBS_VENV=$(VENV) nice -n 3 $(VENV)/bin/nox -s full; full=$$?; \
	wait $$side; other=$$?; \
	echo "---- lint and the torch-free sessions ($(SIDE_LOG)) ----"; cat $(SIDE_LOG); \
	echo "full session: exit $$full; lint and torch-free sessions: exit $$other"; \
	[ $$full -eq 0 ] && [ $$other -eq 0 ]

# The documentation site (mkdocs.yml): generated reference pages, executed examples, --strict.
docs: $(VENV)/.installed
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

# ruff (lint and format) over the code, mypy over the package; the import rules are a test
# (tests/unit/test_layers.py), so they run with the suite.
lint: $(VENV)/.installed
	$(VENV)/bin/ruff check dist_jobs tests bench docs examples noxfile.py
	$(VENV)/bin/ruff format --check dist_jobs tests bench docs examples noxfile.py
	$(VENV)/bin/mypy

# Without the cluster tiers (their tests skip with the reason).
test-fast: $(VENV)/.installed
	$(PY) -m pytest -q -m 'not slurm and not apiserver and not realpods'; rc=$$?; [ $$rc -eq 5 ] && rc=0; exit $$rc

cluster-up:
	DIST_JOBS_SLURM_NODES=$(SLURM_NODES) DIST_JOBS_SLURM_CPUS=$(SLURM_CPUS) bash slurm/cluster/up.sh
cluster-down:
	bash slurm/cluster/down.sh
apiserver-up:
	bash k8s/apiserver/up.sh
apiserver-down:
	bash k8s/apiserver/down.sh
# Real pods: two kubelet nodes + containerd + the operator's controller, on the apiserver tier.
pods-up: $(VENV)/.installed
	DIST_JOBS_PODS_VENV=$(VENV) bash k8s/kubelet/up.sh
pods-down:
	bash k8s/kubelet/down.sh

examples: $(VENV)/.installed
	DIST_JOBS_REFRESH_EXAMPLES=1 $(PY) -m pytest -q tests/unit/render/test_examples.py tests/unit/api/test_sweep.py

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache .hypothesis .nox
