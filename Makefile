# The two commands a newcomer needs: `make demo` and `make test`.
CARGO ?= cargo
PIPELINE ?= examples/pipeline.yml

.PHONY: demo demo-vm test build lint deb image bench bench-plugins bench-pipelines fuzz soak
# What the demos run: the manager, the local plugin, the guest agent (not the AWS SDK's build).
DEMO_PKGS = -p slipway -p fleeting-plugin-local -p slipway-guest-agent

## Build everything and run the example pipeline through the whole stack.
demo:
	@scripts/deps.sh demo
	$(CARGO) build $(DEMO_PKGS) --bins
	./target/debug/slipway exec $(PIPELINE)

## The VM levels: examples/vm-pipeline.yml with a local nesting daemon (QEMU; KVM when it works).
demo-vm:
	@scripts/deps.sh demo-vm
	$(CARGO) build $(DEMO_PKGS) --bins
	scripts/demo-vm.sh

## Install every test dependency, then run the whole suite.
test:
	@scripts/deps.sh test
	$(CARGO) build --workspace --all-targets
	@if $(CARGO) nextest --version >/dev/null 2>&1; then \
		$(CARGO) nextest run --workspace --no-fail-fast; \
	else \
		$(CARGO) test --workspace --no-fail-fast; \
	fi

build:
	$(CARGO) build --workspace --all-targets

## The Debian package (release build, cargo-deb): target/dist/slipway_VERSION_amd64.deb.
deb:
	@scripts/deps.sh deb
	scripts/package.sh deb

## The container image slipway:VERSION (and :latest): the package in a Debian root made here.
image:
	@scripts/deps.sh package
	scripts/package.sh image

## What CI checks besides the tests.
lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings
	@CARGO=$(CARGO) scripts/deny.sh

## Benchmarks: write bench/results/*.json (release build; the plugin binary is needed too).
bench:
	@scripts/deps.sh demo
	$(CARGO) build --release --workspace --bins
	$(CARGO) bench -p slipway --bench dispatch
	$(CARGO) bench -p slipway --bench status
	$(CARGO) bench -p slipway --bench cost

## Instance start-up per fleeting plugin (local, static, aws on moto, qemu beside a bare boot).
bench-plugins:
	@scripts/deps.sh test
	$(CARGO) build --release --workspace --bins
	$(CARGO) bench -p slipway --bench plugins

## The pipeline corpus under slipway exec and gitlab-ci-local: agreement and wall time.
bench-pipelines:
	@scripts/deps.sh test
	$(CARGO) build --release -p slipway --bins
	$(CARGO) bench -p slipway --bench pipelines

## Every fuzz target for SLIPWAY_FUZZ_EXECS execs (default 10 million) on 2 threads (bench/results/fuzz.json).
fuzz:
	@scripts/deps.sh test
	$(CARGO) bench -p slipway-fuzz --bench fuzz

## The chaos soak: 2,000 jobs on the queue and on the GitLab fake under faults (bench/results/soak.json).
soak:
	@scripts/deps.sh test
	$(CARGO) build --release -p slipway -p fleeting-plugin-local -p executor-plugin-nesting --bins
	$(CARGO) bench -p slipway --bench soak
