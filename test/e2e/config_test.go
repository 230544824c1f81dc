package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/nstance-dev/nstance/internal/testing/proctest"
)

// TestDevShardConfigs: the configs scripts/dev-server.sh uploads (derived
// from examples/config-tmux.jsonc) pass nstance-server --validate, and carry
// the shifted advertised ports of their instance.
func TestDevShardConfigs(t *testing.T) {
	root := proctest.Root(t)
	bin := bins.Dir(t, binaries...)
	for n := 1; n <= 2; n++ {
		shard := "dev-" + strconv.Itoa(n)
		cmd := exec.Command("bash", "-c", `source scripts/dev-common.sh && shard_config "$1"`, "shard_config", strconv.Itoa(n))
		cmd.Dir = root
		cmd.Env = append(os.Environ(), "NSTANCE_DEV_PORT_BASE=8990")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("shard_config %d: %v\n%s", n, err, out)
		}
		reg := "127.0.0.1:" + strconv.Itoa(8992+10*(n-1))
		if !strings.Contains(string(out), `"registration_addr": "`+reg+`"`) {
			t.Errorf("%s config does not advertise %s", shard, reg)
		}
		path := filepath.Join(t.TempDir(), shard+".jsonc")
		if err := os.WriteFile(path, out, 0o644); err != nil {
			t.Fatal(err)
		}
		v := exec.Command(filepath.Join(bin, "nstance-server"), "--validate", "--config-file", path, "--shard", shard)
		if vout, err := v.CombinedOutput(); err != nil {
			t.Errorf("%s config rejected: %v\n%s", shard, err, vout)
		}
	}
}
