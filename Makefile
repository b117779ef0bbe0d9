# The two commands a newcomer needs: `make demo` and `make test`.
CARGO ?= cargo
PIPELINE ?= examples/pipeline.yml

.PHONY: demo demo-vm helper test build lint deb image bench bench-plugins bench-pipelines fuzz soak
# What the demos run: the manager, the local plugin, the guest agent (not the AWS SDK's build).
DEMO_PKGS = -p slipway -p fleeting-plugin-local -p slipway-guest-agent

# The job helper, static (it runs in any container and guest) and optimized (it packs and
# unpacks archives): target/x86_64-unknown-linux-gnu/release/slipway-helper.
HELPER_TARGET = x86_64-unknown-linux-gnu
HELPER_BUILD = CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_RUSTFLAGS="-C target-feature=+crt-static -C strip=symbols" \
	$(CARGO) build --release -p slipway-helper --target $(HELPER_TARGET)

## Build everything and run the example pipeline through the whole stack.
demo:
	@scripts/deps.sh demo
	$(CARGO) build $(DEMO_PKGS) --bins
	$(HELPER_BUILD)
	./target/debug/slipway exec $(PIPELINE)

## The VM levels: examples/vm-pipeline.yml with a local nesting daemon (QEMU; KVM when it works).
demo-vm:
	@scripts/deps.sh demo-vm
	$(CARGO) build $(DEMO_PKGS) --bins
	$(HELPER_BUILD)
	scripts/demo-vm.sh

## Install every test dependency, then run the whole suite.
test:
	@scripts/deps.sh test
	$(CARGO) build --workspace --all-targets
	$(HELPER_BUILD)
	@if $(CARGO) nextest --version >/dev/null 2>&1; then \
		$(CARGO) nextest run --workspace --no-fail-fast; \
	else \
		$(CARGO) test --workspace --no-fail-fast; \
	fi

build:
	$(CARGO) build --workspace --all-targets
	$(HELPER_BUILD)

## The job helper alone (static), which slipway copies to where jobs run.
helper:
	$(HELPER_BUILD)

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
	$(CARGO) build --release -p slipway -p slipway-helper --bins
	$(CARGO) bench -p slipway --bench pipelines

## Every fuzz target for SLIPWAY_FUZZ_EXECS execs (default 10 million) on 2 threads (bench/results/fuzz.json).
fuzz:
	@scripts/deps.sh test
	$(CARGO) bench -p slipway-fuzz --bench fuzz

## The chaos soak: 2,000 jobs on the queue and on the GitLab fake under faults (bench/results/soak.json).
soak:
	@scripts/deps.sh test
	$(CARGO) build --release -p slipway -p slipway-helper -p fleeting-plugin-local -p executor-plugin-nesting --bins
	$(CARGO) bench -p slipway --bench soak
