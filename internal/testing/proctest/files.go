package proctest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/nstance-dev/nstance/internal/atomicfile"
)

// WriteFile writes data to path, creating its directory: readers (dev-k8s
// watching its directory, a server reading its config) see the old file or
// the new one, never a part.
func WriteFile(path string, data []byte, mode fs.FileMode) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("directory of %s: %w", path, err)
	}
	return atomicfile.WritePath(path, data, mode)
}

// WriteJSON writes v as indented JSON to path (WriteFile, mode 0644).
func WriteJSON(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return fmt.Errorf("encoding %s: %w", path, err)
	}
	return WriteFile(path, append(b, '\n'), 0o644)
}

// S3Env points the AWS SDK of a child process at dev-s3 at endpoint (a
// URL), with dev-s3's fixed credentials and path-style requests.
func S3Env(endpoint string) []string {
	return []string{"AWS_ACCESS_KEY_ID=dev", "AWS_SECRET_ACCESS_KEY=dev", "AWS_REGION=us-east-1",
		"AWS_ENDPOINT_URL=" + endpoint, "AWS_S3_USE_PATH_STYLE=true"}
}

// OperatorShard is one shard of an operator config.
type OperatorShard struct {
	Name, Registration, Operator string
}

// OperatorConfig is nstance-operator's config file (YAML) for tenant of
// clusterID, naming each shard's Registration and Operator addresses.
func OperatorConfig(clusterID, tenant string, shards ...OperatorShard) []byte {
	var b strings.Builder
	fmt.Fprintf(&b, "cluster_id: %s\ntenant: %s\nshards:\n", clusterID, tenant)
	for _, s := range shards {
		fmt.Fprintf(&b, "  %s:\n    registration_addr: %q\n    operator_addr: %q\n", s.Name, s.Registration, s.Operator)
	}
	return []byte(b.String())
}

// CRDDirs are the CRD directories dev-k8s serves for the operator: the
// repository's (root/config/crd/bases) and Cluster API's core CRDs from the
// module cache.
func CRDDirs(ctx context.Context, root string) ([]string, error) {
	cmd := exec.CommandContext(ctx, "go", "list", "-m", "-f", "{{.Dir}}", "sigs.k8s.io/cluster-api")
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("locating the Cluster API module: %w", err)
	}
	return []string{
		filepath.Join(root, "config", "crd", "bases"),
		filepath.Join(strings.TrimSpace(string(out)), "core", "config", "crd", "bases"),
	}, nil
}

// Output runs bin with args and env as its whole environment and returns
// its stdout; the error carries its stderr.
func Output(ctx context.Context, env []string, bin string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = env
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return out, fmt.Errorf("%s %s: %w: %s", filepath.Base(bin), strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return out, nil
}
