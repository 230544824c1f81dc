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
// the shifted advertised ports of their instance; with the dev load
// balancer (haproxy installed) the worker template names it and its socket
// is under the state directory, without it (NSTANCE_DEV_LB=false, as when
// haproxy is missing) neither is left.
func TestDevShardConfigs(t *testing.T) {
	root := proctest.Root(t)
	bin := bins.Dir(t, binaries...)
	for _, lb := range []bool{true, false} {
		if lb && !haveHAProxy() {
			continue
		}
		for n := 1; n <= 2; n++ {
			devShardConfig(t, root, bin, n, lb)
		}
	}
}

func devShardConfig(t *testing.T, root, bin string, n int, lb bool) {
	t.Helper()
	shard := "dev-" + strconv.Itoa(n)
	cmd := exec.Command("bash", "-c", `source scripts/dev-common.sh && shard_config "$1"`, "shard_config", strconv.Itoa(n))
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "NSTANCE_DEV_PORT_BASE=8990", "NSTANCE_DEV_LB="+strconv.FormatBool(lb))
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("shard_config %d: %v\n%s", n, err, out)
	}
	reg := "127.0.0.1:" + strconv.Itoa(8992+10*(n-1))
	if !strings.Contains(string(out), `"registration_addr": "`+reg+`"`) {
		t.Errorf("%s config does not advertise %s", shard, reg)
	}
	for _, want := range []string{`"load_balancers": ["dev-www"]`, `"socket": "` + filepath.Join(root, "temp", "haproxy", "admin.sock") + `"`} {
		if strings.Contains(string(out), want) != lb {
			t.Errorf("%s config (load balancer %v): contains %s is %v", shard, lb, want, !lb)
		}
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
