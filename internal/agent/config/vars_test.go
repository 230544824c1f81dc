package config

import (
	"bytes"
	"reflect"
	"regexp"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nstance-dev/nstance/internal/testing/envscan"
)

// TestVarsListEveryVariable: every NSTANCE_* name in the code nstance-agent
// links is in Vars (so in --help), every name in Vars is one Load reads,
// and each appears once.
func TestVarsListEveryVariable(t *testing.T) {
	found, err := envscan.Literals("github.com/nstance-dev/nstance/cmd/nstance-agent", envscan.Names)
	require.NoError(t, err)
	require.Contains(t, found, EnvInstanceID, "sanity: the scan sees this package")
	table := map[string]bool{}
	for _, v := range Vars() {
		require.False(t, table[v.Name], "%s listed twice", v.Name)
		table[v.Name] = true
		require.NotEmpty(t, v.Usage, v.Name)
		require.False(t, v.Required && v.Default != "", "%s: required with a default", v.Name)
	}
	for name, pkgs := range found {
		require.True(t, table[name], "%s (in %v) is not in config.Vars, so not in --help", name, pkgs)
	}
	// Every listed variable is read: setting it to a bad value is refused,
	// or it changes the configuration.
	base := map[string]string{EnvInstanceID: "i", EnvIdentityDir: "/id", EnvRegistrationAddr: "h:1", EnvAgentAddr: "h:2"}
	load := func(extra map[string]string) (Config, error) {
		env := map[string]string{}
		for k, v := range base {
			env[k] = v
		}
		for k, v := range extra {
			env[k] = v
		}
		return Load(func(k string) (string, bool) { v, ok := env[k]; return v, ok })
	}
	def, err := load(nil)
	require.NoError(t, err)
	for _, v := range Vars() {
		if v.Required {
			_, err := load(map[string]string{v.Name: ""})
			require.ErrorContains(t, err, v.Name+": required")
			continue
		}
		var changed bool
		for _, val := range []string{"/x/y", "imds", "2s", "0700", "12", "debug", "text", "http://127.0.0.1:1", "p-1"} {
			c, err := load(map[string]string{v.Name: val})
			if err != nil || !reflect.DeepEqual(c, def) {
				changed = true
				break
			}
		}
		require.True(t, changed, "%s is listed but Load ignores it", v.Name)
	}
}

func TestWriteUsageListsEveryVar(t *testing.T) {
	var out bytes.Buffer
	WriteUsage(&out, "nstance-agent")
	for _, v := range Vars() {
		require.Regexp(t, `(?m)^  `+regexp.QuoteMeta(v.Name)+` `, out.String())
	}
	require.Regexp(t, `(?m)^  NSTANCE_INSTANCE_ID +the instance id \(required\)$`, out.String())
	require.Regexp(t, `(?m)^  NSTANCE_RECONNECT_MAX +largest reconnect backoff \(default 30s\)$`, out.String())
}
