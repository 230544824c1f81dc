# Nstance monorepo. `make help` lists the targets.
SHELL := /usr/bin/env bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

ROOT    := $(shell pwd)
BIN     := $(ROOT)/bin
GO      ?= go
export PATH := $(BIN):$(PATH)
export CGO_ENABLED ?= 0

VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
COMMIT  ?= $(shell git rev-parse --short=12 HEAD 2>/dev/null)
# Without these stamps (go install, go build) internal/version reads the
# module build info instead.
LDFLAGS := -s -w -X github.com/nstance-dev/nstance/internal/version.Version=$(VERSION) \
	-X github.com/nstance-dev/nstance/internal/version.Commit=$(COMMIT)

# Pinned tool versions. Each is installed into ./bin.
CONTROLLER_GEN_VERSION     := v0.23.0
PROTOC_GEN_GO_VERSION      := v1.36.12
PROTOC_GEN_GO_GRPC_VERSION := v1.6.2
BUF_VERSION                := v1.75.0
KUSTOMIZE_VERSION          := v5.8.2
GOLANGCI_LINT_VERSION      := v2.15.0

BINARIES := nstance-server nstance-agent nstance-operator nstance-admin dev-k8s dev-s3
GO_TEST_FLAGS ?= -count=1 -timeout 20m
# go-install,PACKAGE@VERSION: `go install` into ./bin with progress (scripts/lib/progress.sh).
go-install = @source scripts/lib/progress.sh; PROGRESS_TAG=tools; \
	progress_run "go install $(1) into ./bin" env GOBIN=$(BIN) $(GO) install $(1)
# Generated files checked by `make verify`.
GENERATED := pkg/proto api/v1beta1/zz_generated.deepcopy.go api/controlplane/v1beta1/zz_generated.deepcopy.go config/crd config/rbac deploy/helm/nstance-operator/files deploy/helm/nstance-server/files

##@ General
.PHONY: help
help: ## Show this help.
	@awk 'BEGIN {FS = ":.*##"; printf "Usage: make <target>\n"} \
		/^[a-zA-Z0-9_.-]+:.*?##/ { printf "  \033[36m%-22s\033[0m %s\n", $$1, $$2 } \
		/^##@/ { printf "\n\033[1m%s\033[0m\n", substr($$0, 5) }' $(MAKEFILE_LIST)

##@ Build
.PHONY: build
build: ## Build every binary into ./bin.
	@mkdir -p $(BIN)
	@source scripts/lib/progress.sh; PROGRESS_TAG=build; \
	for b in $(BINARIES); do \
		[ -d cmd/$$b ] || continue; \
		progress_run "go build bin/$$b" $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN)/$$b ./cmd/$$b; \
	done

.PHONY: $(BINARIES)
$(BINARIES): ## Build one binary, e.g. `make nstance-admin`.
	@mkdir -p $(BIN)
	$(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN)/$@ ./cmd/$@

##@ Code generation
.PHONY: generate
generate: generate-proto generate-k8s helm-sync ## Regenerate protobuf code, deepcopy, CRDs, RBAC and the chart's copies of them.

.PHONY: generate-proto
generate-proto: $(BIN)/buf $(BIN)/protoc-gen-go $(BIN)/protoc-gen-go-grpc ## Regenerate Go code from proto/.
	if [ -d pkg/proto ]; then find pkg/proto -name "*.pb.go" -delete; fi
	cd proto && $(BIN)/buf generate

.PHONY: generate-k8s
generate-k8s: $(BIN)/controller-gen ## Regenerate deepcopy, CRDs and RBAC from Go markers.
	$(BIN)/controller-gen object:headerFile=scripts/boilerplate.go.txt paths=./api/...
	rm -rf config/crd/bases
	$(BIN)/controller-gen crd:generateEmbeddedObjectMeta=true paths=./api/... output:crd:artifacts:config=config/crd/bases
	@if grep -rqs '+kubebuilder:rbac' internal/operator; then \
		$(BIN)/controller-gen rbac:roleName=nstance-operator paths=./internal/operator/... output:rbac:artifacts:config=config/rbac; \
	fi

.PHONY: verify
verify: generate verify-tidy ## Fail when generated files differ from what is committed or a go.mod is not tidy.
	@drift=$$(git status --porcelain --untracked-files=all -- $(GENERATED)); \
	if [ -n "$$drift" ]; then \
		echo "generated files are out of date; run 'make generate' and commit:"; echo "$$drift"; \
		git --no-pager diff --stat -- $(GENERATED); exit 1; \
	fi
	@echo "generated files are up to date"

# The main module and the tool modules under scripts/ (each has its own go.mod).
GO_MODULES := . scripts/envtest/etcd scripts/envtest/kube-apiserver scripts/tools/overmind scripts/tools/promtool scripts/tools/clusterctl scripts/tools/fake-gcs-server scripts/tools/versitygw scripts/tools/weed scripts/tools/minio scripts/image

.PHONY: verify-tidy
verify-tidy: ## Fail when `go mod tidy` would change a go.mod or go.sum.
	@source scripts/lib/progress.sh; PROGRESS_TAG=verify-tidy; failed=; \
	for m in $(GO_MODULES); do \
		rc=0; drift=$$(cd $$m && GONOSUMDB=k8s.io progress_run "go mod tidy -diff in $$m" $(GO) mod tidy -diff) || rc=$$?; \
		if [ $$rc -ne 0 ]; then \
			echo "$$m: go mod tidy -diff failed (exit $$rc); run 'cd $$m && go mod tidy' and commit go.mod and go.sum:"; \
			echo "$$drift"; failed=1; \
		fi; \
	done; \
	[ -z "$$failed" ] || exit 1; \
	echo "go.mod and go.sum are tidy in: $(GO_MODULES)"

##@ Test
.PHONY: envtest-assets
envtest-assets: ## Build kube-apiserver, etcd, kubectl and kubemark for envtest (cached in ~/.cache/nstance/envtest).
	@scripts/envtest-assets.sh

.PHONY: test
test: verify lint test-go ## Everything CI runs: generated-code check, lint, unit and envtest tests.

.PHONY: test-go
test-go: $(BIN)/promtool $(BIN)/clusterctl $(BIN)/helm ## Unit and envtest tests (builds the envtest binaries on first use; promtool runs the alert unit tests, clusterctl and helm test/clusterctl).
	@assets=$$(scripts/envtest-assets.sh); source scripts/lib/progress.sh; PROGRESS_TAG=test-go; \
		progress_run "go test $(GO_TEST_FLAGS) ./... (KUBEBUILDER_ASSETS=$$assets)" env KUBEBUILDER_ASSETS=$$assets $(GO) test $(GO_TEST_FLAGS) ./...

.PHONY: compat
compat: ## The storage compatibility matrix (test/compat): start-up probe, objstore contract and a two-elector handover on fake-gcs-server, Versity Gateway, SeaweedFS and MinIO, and two nstance-server processes handing over on each (test/chaos TestLeaderCutOffFromOtherStores), each built once from the module proxy into ~/.cache/nstance/tools (the first run builds for a long time). `make test` runs fake-gcs-server, and Versity Gateway once it is built.
	NSTANCE_COMPAT=1 nice -n 15 $(GO) test -count=1 -v -timeout 120m -run 'TestCompat|TestLeaderCutOffFromOtherStores' ./test/compat/ ./test/chaos/

# make chaos also runs server and agent certificates of 2 minutes for 10 minutes and 20 agent kills.
chaos: export CHAOS_CERT_VALIDITY := 2m
chaos: export CHAOS_RENEWAL_RUN := 10m
chaos: export CHAOS_KILL_RUNS := 20

.PHONY: chaos
chaos: ## Long fault-injection runs (test/chaos): 20 leader handovers, a 20 s SIGSTOP, 10 leader kills during 50-instance scale-ups. The short variants run in `make test`.
	CHAOS_RUNS=20 CHAOS_FREEZE=20 CHAOS_SCALE_ROUNDS=10 CHAOS_SCALE_STEP=50 $(GO) test -count=1 -v -timeout 60m ./test/chaos/...

.PHONY: test-attack
test-attack: ## The black-box attack suite alone (test/attack, also part of test-go), one line per case.
	$(GO) test -count=1 -v -run TestAttack ./test/attack

FUZZTIME ?= 1m
FUZZ_PARALLEL ?= 2
.PHONY: fuzz
fuzz: ## Run every Go fuzz target for FUZZTIME each (default 1m); FUZZ_CPU_MINUTES=10 repeats each until 10 CPU-minutes; FUZZ_TARGETS=regexp selects. Prints wall and CPU time per target; fails on a crash.
	FUZZTIME='$(FUZZTIME)' FUZZ_CPU_MINUTES='$(FUZZ_CPU_MINUTES)' FUZZ_PARALLEL='$(FUZZ_PARALLEL)' FUZZ_TARGETS='$(FUZZ_TARGETS)' scripts/fuzz.sh

.PHONY: lint
lint: $(BIN)/golangci-lint ## gofmt, then golangci-lint (.golangci.yml: govet, errcheck, staticcheck, unused, ineffassign, gocritic).
	@files=$$(git ls-files '*.go' | grep -v '^scripts/envtest/'); \
	unformatted=$$(gofmt -l $$files) || { echo "gofmt failed (see above)"; exit 1; }; \
	if [ -n "$$unformatted" ]; then echo "not gofmt-ed:"; echo "$$unformatted"; exit 1; fi
	@source scripts/lib/progress.sh; PROGRESS_TAG=lint; progress_run "golangci-lint run ./..." $(BIN)/golangci-lint run --allow-parallel-runners ./...

.PHONY: bench
bench: ## Run every benchmark and print the figures (see bench/RESULTS.md).
	assets=$$(scripts/envtest-assets.sh); KUBEBUILDER_ASSETS=$$assets $(GO) test -run '^$$' -bench . -benchmem -count 1 -timeout 45m ./...
	$(GO) run ./bench/devs3 -duration 5s -runs 5
	$(GO) run ./bench/registration -n 5000 -c 16 -storage s3
	$(GO) run ./bench/registration -n 10000 -storm 1m -storage s3
	assets=$$(scripts/envtest-assets.sh); KUBEBUILDER_ASSETS=$$assets $(GO) run ./bench/devk8s
	$(GO) run ./bench/agents -agents 1000,5000,10000 -duration 10s -runs 3
	$(GO) run ./bench/takeover -instances 10000 -markers 0,100000 -runs 3

##@ Tools
$(BIN)/controller-gen:
	$(call go-install,sigs.k8s.io/controller-tools/cmd/controller-gen@$(CONTROLLER_GEN_VERSION))
$(BIN)/protoc-gen-go:
	$(call go-install,google.golang.org/protobuf/cmd/protoc-gen-go@$(PROTOC_GEN_GO_VERSION))
$(BIN)/protoc-gen-go-grpc:
	$(call go-install,google.golang.org/grpc/cmd/protoc-gen-go-grpc@$(PROTOC_GEN_GO_GRPC_VERSION))
$(BIN)/buf:
	$(call go-install,github.com/bufbuild/buf/cmd/buf@$(BUF_VERSION))
$(BIN)/kustomize:
	$(call go-install,sigs.k8s.io/kustomize/kustomize/v5@$(KUSTOMIZE_VERSION))
$(BIN)/golangci-lint:
	$(call go-install,github.com/golangci/golangci-lint/v2/cmd/golangci-lint@$(GOLANGCI_LINT_VERSION))

# promtool (Prometheus's rule checker and rule unit-test runner, used by
# internal/packaging on deploy/monitoring/tests) is built in its own module,
# scripts/tools/promtool, which pins the Prometheus release: its dependencies
# stay out of the main go.mod. Rebuilt only when that go.mod changes.
# A build is kept in the user's cache under the hash of go.mod and go.sum, so
# a fresh clone (CI) copies it instead of compiling Prometheus again.
TOOLS_CACHE ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/nstance/tools
$(BIN)/promtool: scripts/tools/promtool/go.mod scripts/tools/promtool/go.sum
	@source scripts/lib/progress.sh; PROGRESS_TAG=tools; \
		key=$$(cat scripts/tools/promtool/go.mod scripts/tools/promtool/go.sum | sha256sum | cut -c1-16); \
		cached="$(TOOLS_CACHE)/promtool-$$key"; mkdir -p "$(BIN)"; \
		if [ -x "$$cached" ]; then cp "$$cached" $(BIN)/promtool && echo "tools: bin/promtool from $$cached" >&2; exit 0; fi; \
		(cd scripts/tools/promtool && progress_run "go build bin/promtool (module scripts/tools/promtool)" \
			$(GO) build -trimpath -o $(BIN)/promtool github.com/prometheus/prometheus/cmd/promtool) && \
		mkdir -p "$(TOOLS_CACHE)" && cp $(BIN)/promtool "$$cached.tmp.$$$$" && mv "$$cached.tmp.$$$$" "$$cached"
# `make bin/promtool` names the same file relative to the repository.
bin/promtool: $(BIN)/promtool ;

# clusterctl (Cluster API's command line, run by test/clusterctl against a
# real API server) is built the same way from scripts/tools/clusterctl, which
# pins the sigs.k8s.io/cluster-api of the main go.mod, and cached likewise.
$(BIN)/clusterctl: scripts/tools/clusterctl/go.mod scripts/tools/clusterctl/go.sum
	@source scripts/lib/progress.sh; PROGRESS_TAG=tools; \
		key=$$(cat scripts/tools/clusterctl/go.mod scripts/tools/clusterctl/go.sum | sha256sum | cut -c1-16); \
		cached="$(TOOLS_CACHE)/clusterctl-$$key"; mkdir -p "$(BIN)"; \
		if [ -x "$$cached" ]; then cp "$$cached" $(BIN)/clusterctl && echo "tools: bin/clusterctl from $$cached" >&2; exit 0; fi; \
		(cd scripts/tools/clusterctl && progress_run "go build bin/clusterctl (module scripts/tools/clusterctl)" \
			$(GO) build -trimpath -o $(BIN)/clusterctl sigs.k8s.io/cluster-api/cmd/clusterctl) && \
		mkdir -p "$(TOOLS_CACHE)" && cp $(BIN)/clusterctl "$$cached.tmp.$$$$" && mv "$$cached.tmp.$$$$" "$$cached"
bin/clusterctl: $(BIN)/clusterctl ;

.PHONY: tools
tools: $(BIN)/controller-gen $(BIN)/protoc-gen-go $(BIN)/protoc-gen-go-grpc $(BIN)/buf $(BIN)/kustomize $(BIN)/golangci-lint $(BIN)/promtool $(BIN)/clusterctl ## Install pinned tools into ./bin.

##@ Development
.PHONY: clean
clean: ## Remove ./bin.
	rm -rf $(BIN)

##@ Packaging
HELM_VERSION      := v3.22.0
CHART             := deploy/helm/nstance-operator
DIST              := $(ROOT)/dist
IMAGE_ARCH        ?= $(shell $(GO) env GOARCH)
IMAGE_REPO        ?= ghcr.io/nstance-dev

$(BIN)/helm:
	$(call go-install,helm.sh/helm/v3/cmd/helm@$(HELM_VERSION))

# build-image: static linux binary for $(IMAGE_ARCH), then an image archive
# (OCI layout + docker manifest.json) written by scripts/image, no daemon.
# The version comes from VERSION (ldflags), not from the work tree's VCS
# state, so two builds of the same inputs are byte-identical even while
# the tree changes.
define build-image
	@mkdir -p $(DIST)/images/$(IMAGE_ARCH)
	GOOS=linux GOARCH=$(IMAGE_ARCH) CGO_ENABLED=0 $(GO) build -trimpath -buildvcs=false -ldflags '$(LDFLAGS)' \
		-o $(DIST)/images/$(IMAGE_ARCH)/$(1) ./cmd/$(1)
	cd scripts/image && $(GO) run . -binary $(DIST)/images/$(IMAGE_ARCH)/$(1) -name $(1) \
		-version $(VERSION) -arch $(IMAGE_ARCH) -repo $(IMAGE_REPO) \
		-out $(DIST)/images/$(1)-$(VERSION)-linux-$(IMAGE_ARCH).tar
	@echo "load with: docker load -i $(DIST)/images/$(1)-$(VERSION)-linux-$(IMAGE_ARCH).tar"
endef

.PHONY: image-operator image-server image-agent image-admin images
image-operator: ## Image archive for nstance-operator in dist/images (IMAGE_ARCH=amd64|arm64).
	$(call build-image,nstance-operator)
image-server: ## Image archive for nstance-server in dist/images.
	$(call build-image,nstance-server)
image-agent: ## Image archive for nstance-agent in dist/images.
	$(call build-image,nstance-agent)
image-admin: ## Image archive for nstance-admin in dist/images.
	$(call build-image,nstance-admin)
images: image-operator image-server image-agent image-admin ## All four image archives.

.PHONY: helm-sync
helm-sync: ## Copy the generated CRDs and operator RBAC (config/) and deploy/monitoring into the Helm charts.
	rm -f $(CHART)/files/crds/*.yaml
	cp config/crd/bases/*.yaml $(CHART)/files/crds/
	cp config/rbac/role.yaml $(CHART)/files/rbac/role.yaml
	for chart in $(CHART) deploy/helm/nstance-server; do mkdir -p $$chart/files/monitoring && \
		cp deploy/monitoring/prometheusrule.yaml deploy/monitoring/grafana-dashboard.json $$chart/files/monitoring/ || exit 1; done

.PHONY: helm-lint
helm-lint: $(BIN)/helm ## helm lint the charts with their ci/ values (the defaults lack required values).
	@for chart in $(CHART) deploy/helm/nstance-server; do for v in $$chart/ci/*-values.yaml; do \
		echo "helm lint --strict $$chart -f $$v"; $(BIN)/helm lint --strict $$chart -f $$v || exit 1; \
	done; done

.PHONY: release-manifests
release-manifests: $(BIN)/helm ## clusterctl infrastructure-components.yaml, metadata.yaml and cluster templates in dist/.
	@mkdir -p $(DIST)
	deploy/clusterctl/components.sh $(BIN)/helm $(VERSION) > $(DIST)/infrastructure-components.yaml
	cp metadata.yaml $(DIST)/metadata.yaml
	cp templates/cluster-template.yaml templates/cluster-template-machinedeployment.yaml $(DIST)/

.PHONY: release
release: $(BIN)/helm ## Every artifact of VERSION=vX.Y.Z in dist/<version>/: binaries, multi-arch images, charts, clusterctl repository, changelog, checksums.
	VERSION='$(VERSION)' HELM='$(BIN)/helm' LDFLAGS='$(LDFLAGS)' DIST='$(DIST)' GO='$(GO)' IMAGE_REPO='$(IMAGE_REPO)' \
		scripts/release.sh

.PHONY: release-check
release-check: ## Build release VERSION twice (dist/check-a, dist/check-b) and compare every file's checksum.
	$(MAKE) release VERSION='$(VERSION)' DIST='$(DIST)/check-a'
	$(MAKE) release VERSION='$(VERSION)' DIST='$(DIST)/check-b'
	diff '$(DIST)/check-a/$(VERSION)/SHA256SUMS' '$(DIST)/check-b/$(VERSION)/SHA256SUMS'
	@echo "release $(VERSION) is reproducible"

##@ Development stack
AIR_VERSION      := v1.67.4
OVERMIND_VERSION := v2.5.1
DEV_DIR          ?= temp
DEV_SERVERS      ?= 2
OVERMIND         := $(BIN)/overmind
# nstance-server and nstance-operator run under Air, which builds its own
# copies; building them here fills the build cache first, with progress.
DEV_BINARIES     := dev-s3 dev-k8s nstance-admin nstance-agent nstance-server nstance-operator
comma            := ,

$(BIN)/air:
	$(call go-install,github.com/air-verse/air@$(AIR_VERSION))
# `go install` refuses Overmind (its go.mod has replace directives): build it
# from the pinned tools module instead.
$(BIN)/overmind: scripts/tools/overmind/go.mod
	@source scripts/lib/progress.sh; PROGRESS_TAG=tools; cd scripts/tools/overmind && \
		progress_run "go build bin/overmind (module scripts/tools/overmind)" $(GO) build -o $(BIN)/overmind github.com/DarthSim/overmind/v2

# check captures each tool's version output whole before matching it: piping
# into `grep -q` ends the pipe early and, under pipefail, reinstalls at random.
.PHONY: check
check: ## Verify go, tmux, air and overmind; install the pinned air and overmind into ./bin when missing.
	@command -v $(GO) >/dev/null || { echo "check: go is missing (Go 1.26 needed)"; exit 1; }
	@command -v tmux >/dev/null || { echo "check: tmux is missing (apt-get install tmux / brew install tmux)"; exit 1; }
	@command -v curl >/dev/null || { echo "check: curl is missing (apt-get install curl)"; exit 1; }
	@command -v haproxy >/dev/null || echo "check: haproxy is missing: the dev stack starts without its load balancer (apt-get install haproxy / brew install haproxy)"
	@source scripts/lib/progress.sh; PROGRESS_TAG=check; \
	have=$$($(BIN)/air -v 2>&1 || true); \
	if [[ $$have != *'$(AIR_VERSION)'* ]]; then \
		progress_run "installing air $(AIR_VERSION) into ./bin (go install)" $(MAKE) --no-print-directory -B $(BIN)/air; fi; \
	have=$$($(OVERMIND) --version 2>&1 || true); \
	if [[ $$have != *'$(OVERMIND_VERSION:v%=%)'* ]]; then \
		progress_run "building overmind $(OVERMIND_VERSION) into ./bin (module scripts/tools/overmind)" $(MAKE) --no-print-directory -B $(OVERMIND); fi
	@echo "go:       $$($(GO) env GOVERSION) ($$(command -v $(GO)))"
	@echo "tmux:     $$(tmux -V)"
	@echo "air:      $$(command -v air) $(AIR_VERSION)"
	@echo "overmind: $$(command -v overmind) $$(overmind --version)"

.PHONY: dev-binaries
dev-binaries: ## Build the dev stack's binaries into ./bin, naming each.
	@mkdir -p $(BIN)
	@source scripts/lib/progress.sh; PROGRESS_TAG=dev-binaries; \
	for b in $(DEV_BINARIES); do \
		[ -d cmd/$$b ] || continue; \
		progress_run "go build bin/$$b" env CGO_ENABLED=0 $(GO) build -o $(BIN)/$$b ./cmd/$$b; \
	done

# dev-start PROCESSES,ENV: run Procfile processes under Overmind (foreground;
# Ctrl+C stops them) plus `ready`, which waits for them and prints a summary.
# Refuses to start a second stack over a live one.
define dev-start
	@if [ -S $(DEV_DIR)/overmind.sock ] && $(OVERMIND) status -s $(DEV_DIR)/overmind.sock >/dev/null 2>&1; then \
		echo "a dev stack is already running (overmind socket $(DEV_DIR)/overmind.sock); run 'make clean-dev' first"; exit 1; fi
	@mkdir -p $(DEV_DIR)/pids
	@date +%s > $(DEV_DIR)/pids/started-at
	export NSTANCE_DEV_DIR=$(DEV_DIR) NSTANCE_DEV_SERVERS=$(DEV_SERVERS) $(2); \
		echo $$$$ > $(DEV_DIR)/pids/overmind.pid; \
		exec $(OVERMIND) start -s $(DEV_DIR)/overmind.sock -N -t 15 -l $(1)$(comma)lb$(comma)ready -c ready$(comma)lb -m server=$(DEV_SERVERS)
endef

.PHONY: dev-tmux
dev-tmux: check dev-binaries ## dev-s3 + 2 nstance-servers (shards dev-1, dev-2; ports 8990-8994, 9000-9004), agents in tmux.
	$(call dev-start,s3$(comma)server$(comma)status,NSTANCE_DEV_WITH_K8S=false)

.PHONY: dev-tmux-k8s
dev-tmux-k8s: check dev-binaries envtest-assets ## dev-tmux plus dev-k8s (:6443), nstance-operator and a hollow kubelet per instance.
	$(call dev-start,s3$(comma)server$(comma)k8s$(comma)operator$(comma)status,)

.PHONY: dev-tmux-apiserver
dev-tmux-apiserver: check dev-binaries envtest-assets ## dev-tmux plus a real kube-apiserver + etcd (envtest binaries), the operator and a hollow kubelet per instance.
	$(call dev-start,s3$(comma)server$(comma)k8s$(comma)operator$(comma)status,NSTANCE_DEV_K8S=apiserver KUBEBUILDER_ASSETS=$$(scripts/envtest-assets.sh --dir))

.PHONY: dev-operator
dev-operator: check dev-binaries ## The operator alone against temp/operator/kubeconfig (e.g. kind), servers from make dev-tmux.
	NSTANCE_DEV_DIR=$(DEV_DIR) NSTANCE_DEV_SERVERS=$(DEV_SERVERS) scripts/dev-operator.sh external

.PHONY: clean-dev
clean-dev: ## Stop what the dev stack started (Overmind, agents' tmux session, recorded PIDs) and remove temp/.
	@NSTANCE_DEV_DIR=$(DEV_DIR) scripts/dev-clean.sh

.PHONY: e2e
e2e: ## End-to-end test: dev-s3, 2 servers (tmux), dev-k8s, operator from built binaries, driven by JSON files.
	$(GO) test -count=1 -timeout 10m -v ./test/e2e/
