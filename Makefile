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
LDFLAGS := -s -w -X github.com/nstance-dev/nstance/internal/version.Version=$(VERSION)

# Pinned tool versions (SPEC section 12). Each is installed into ./bin.
CONTROLLER_GEN_VERSION     := v0.23.0
PROTOC_GEN_GO_VERSION      := v1.36.12
PROTOC_GEN_GO_GRPC_VERSION := v1.6.2
BUF_VERSION                := v1.75.0
KUSTOMIZE_VERSION          := v5.8.2

BINARIES := nstance-server nstance-agent nstance-operator nstance-admin dev-k8s dev-s3
GO_TEST_FLAGS ?= -count=1 -timeout 20m
# Generated files checked by `make verify`.
GENERATED := pkg/proto api/v1beta1/zz_generated.deepcopy.go config/crd config/rbac

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
	@for b in $(BINARIES); do \
		if [ -d cmd/$$b ]; then $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN)/$$b ./cmd/$$b || exit 1; fi; \
	done

.PHONY: $(BINARIES)
$(BINARIES): ## Build one binary, e.g. `make nstance-admin`.
	@mkdir -p $(BIN)
	$(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN)/$@ ./cmd/$@

##@ Code generation
.PHONY: generate
generate: generate-proto generate-k8s ## Regenerate protobuf code, deepcopy, CRDs and RBAC.

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
verify: generate ## Fail when generated files differ from what is committed.
	@drift=$$(git status --porcelain --untracked-files=all -- $(GENERATED)); \
	if [ -n "$$drift" ]; then \
		echo "generated files are out of date; run 'make generate' and commit:"; echo "$$drift"; \
		git --no-pager diff --stat -- $(GENERATED); exit 1; \
	fi
	@echo "generated files are up to date"

##@ Test
.PHONY: envtest-assets
envtest-assets: ## Build kube-apiserver, etcd and kubectl for envtest (cached in ~/.cache/nstance/envtest).
	@scripts/envtest-assets.sh

.PHONY: test
test: verify lint test-go ## Everything CI runs: generated-code check, lint, unit and envtest tests.

.PHONY: test-go
test-go: ## Unit and envtest tests (builds the envtest binaries on first use).
	KUBEBUILDER_ASSETS=$$(scripts/envtest-assets.sh) $(GO) test $(GO_TEST_FLAGS) ./...

.PHONY: lint
lint: ## gofmt and go vet.
	@unformatted=$$(gofmt -l $$(git ls-files '*.go' | grep -v '^scripts/envtest/') 2>/dev/null); \
	if [ -n "$$unformatted" ]; then echo "not gofmt-ed:"; echo "$$unformatted"; exit 1; fi
	$(GO) vet ./...

.PHONY: bench
bench: ## Run every benchmark and print the figures (see bench/RESULTS.md).
	KUBEBUILDER_ASSETS=$$(scripts/envtest-assets.sh) $(GO) test -run '^$$' -bench . -benchmem -count 1 ./...
	@for b in bench/*/; do [ -f $$b/main.go ] && $(GO) run ./$$b || true; done

##@ Tools
$(BIN)/controller-gen:
	GOBIN=$(BIN) $(GO) install sigs.k8s.io/controller-tools/cmd/controller-gen@$(CONTROLLER_GEN_VERSION)
$(BIN)/protoc-gen-go:
	GOBIN=$(BIN) $(GO) install google.golang.org/protobuf/cmd/protoc-gen-go@$(PROTOC_GEN_GO_VERSION)
$(BIN)/protoc-gen-go-grpc:
	GOBIN=$(BIN) $(GO) install google.golang.org/grpc/cmd/protoc-gen-go-grpc@$(PROTOC_GEN_GO_GRPC_VERSION)
$(BIN)/buf:
	GOBIN=$(BIN) $(GO) install github.com/bufbuild/buf/cmd/buf@$(BUF_VERSION)
$(BIN)/kustomize:
	GOBIN=$(BIN) $(GO) install sigs.k8s.io/kustomize/kustomize/v5@$(KUSTOMIZE_VERSION)

.PHONY: tools
tools: $(BIN)/controller-gen $(BIN)/protoc-gen-go $(BIN)/protoc-gen-go-grpc $(BIN)/buf $(BIN)/kustomize ## Install pinned tools into ./bin.

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
RELEASE_BINARIES  := nstance-server nstance-agent nstance-operator nstance-admin
RELEASE_ARCHES    := amd64 arm64

$(BIN)/helm:
	GOBIN=$(BIN) $(GO) install helm.sh/helm/v3/cmd/helm@$(HELM_VERSION)

# build-image: static linux binary for $(IMAGE_ARCH), then an image archive
# (OCI layout + docker manifest.json) written by scripts/image, no daemon.
define build-image
	@mkdir -p $(DIST)/images/$(IMAGE_ARCH)
	GOOS=linux GOARCH=$(IMAGE_ARCH) CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)' \
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
helm-sync: ## Copy the generated CRDs and operator RBAC (config/) into the Helm chart.
	rm -f $(CHART)/files/crds/*.yaml
	cp config/crd/bases/*.yaml $(CHART)/files/crds/
	cp config/rbac/role.yaml $(CHART)/files/rbac/role.yaml

.PHONY: helm-lint
helm-lint: $(BIN)/helm ## helm lint the chart with default and sample values.
	$(BIN)/helm lint --strict $(CHART)
	$(BIN)/helm lint --strict $(CHART) -f $(CHART)/ci/sample-values.yaml

.PHONY: release-manifests
release-manifests: $(BIN)/helm ## clusterctl infrastructure-components.yaml and metadata.yaml in dist/.
	@mkdir -p $(DIST)
	deploy/clusterctl/components.sh $(BIN)/helm $(VERSION) > $(DIST)/infrastructure-components.yaml
	cp metadata.yaml $(DIST)/metadata.yaml

.PHONY: release
release: release-manifests ## linux/amd64+arm64 binaries, checksums and clusterctl manifests in dist/.
	@for b in $(RELEASE_BINARIES); do for a in $(RELEASE_ARCHES); do \
		echo "build $$b linux/$$a"; \
		GOOS=linux GOARCH=$$a CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(DIST)/$$b-linux-$$a ./cmd/$$b || exit 1; \
	done; done
	cd $(DIST) && sha256sum $(foreach b,$(RELEASE_BINARIES),$(foreach a,$(RELEASE_ARCHES),$(b)-linux-$(a))) \
		infrastructure-components.yaml metadata.yaml > checksums.txt
	@cat $(DIST)/checksums.txt
