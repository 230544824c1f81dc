package hostdown_test

import (
	"context"
	"errors"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nstance-dev/nstance/internal/agent/hostdown"
	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

func TestCheck(t *testing.T) {
	withSystemd := t.TempDir()
	without := filepath.Join(t.TempDir(), "absent")
	state := func(s string, err error) func(context.Context) (string, error) {
		return func(context.Context) (string, error) { return s, err }
	}
	cases := []struct {
		name    string
		d       hostdown.Detector
		down    bool
		wantErr bool
	}{
		{name: "never", d: hostdown.Detector{Mode: hostdown.ModeNever, SystemdDir: withSystemd, SystemState: state("stopping", nil)}},
		{name: "always", d: hostdown.Detector{Mode: hostdown.ModeAlways, SystemdDir: without}, down: true},
		{name: "auto, systemd stopping", d: hostdown.Detector{SystemdDir: withSystemd, SystemState: state("stopping", nil)}, down: true},
		{name: "auto, systemd running (an agent restart)", d: hostdown.Detector{SystemdDir: withSystemd, SystemState: state("running", nil)}},
		{name: "auto, systemd degraded", d: hostdown.Detector{SystemdDir: withSystemd, SystemState: state("degraded", nil)}},
		{name: "auto, no systemd", d: hostdown.Detector{SystemdDir: without, SystemState: state("stopping", nil)}},
		{name: "auto, systemctl fails", d: hostdown.Detector{SystemdDir: withSystemd, SystemState: state("", errors.New("exec: not found"))}, wantErr: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			n, err := tc.d.Check(context.Background())
			if tc.wantErr {
				require.Error(t, err)
				require.Nil(t, n)
				return
			}
			require.NoError(t, err)
			if !tc.down {
				require.Nil(t, n)
				return
			}
			require.Equal(t, nstancev1.TerminationKind_TERMINATION_KIND_SHUTDOWN, n.GetKind())
			require.NotEmpty(t, n.GetMessage())
		})
	}
}

func TestParseMode(t *testing.T) {
	for in, want := range map[string]string{"": "auto", "auto": "auto", "always": "always", "never": "never"} {
		got, err := hostdown.ParseMode(in)
		require.NoError(t, err)
		require.Equal(t, want, got)
	}
	_, err := hostdown.ParseMode("sometimes")
	require.ErrorContains(t, err, `"sometimes" is not auto, always or never`)
}
