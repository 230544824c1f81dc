package logging

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"io"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func parseZap(t *testing.T, args ...string) (Options, error) {
	t.Helper()
	var o Options
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	o.BindFlags(fs, "X", func(string) string { return "" })
	o.BindZapFlags(fs)
	err := fs.Parse(args)
	return o, err
}

func TestZapFlags(t *testing.T) {
	tests := []struct {
		args []string
		want Options
	}{
		{nil, Defaults()},
		{[]string{"--zap-log-level=debug", "--zap-encoder=console"}, Options{Level: "debug", Format: FormatText}},
		{[]string{"--zap-log-level=3", "--zap-encoder=json"}, Options{Level: "3", Format: FormatJSON}},
		{[]string{"--zap-log-level=error", "--log-level=warn"}, Options{Level: "warn", Format: FormatAuto}},
		{[]string{"--log-level=warn", "--zap-log-level=panic"}, Options{Level: "panic", Format: FormatAuto}},
		{[]string{"--zap-devel"}, Options{Level: "info", Format: FormatAuto, Devel: true}},
		{[]string{"--zap-devel=false"}, Defaults()},
		{[]string{"--zap-stacktrace-level=error", "--zap-time-encoding=rfc3339"}, Options{Level: "info", Format: FormatAuto, StacktraceLevel: "error", TimeEncoding: "rfc3339"}},
	}
	for _, tc := range tests {
		o, err := parseZap(t, tc.args...)
		require.NoError(t, err, "%v", tc.args)
		require.Equal(t, tc.want, o, "%v", tc.args)
		require.NoError(t, o.Validate())
	}
	for _, bad := range [][]string{{"--zap-log-level=loud"}, {"--zap-encoder=xml"}, {"--zap-devel=maybe"},
		{"--zap-stacktrace-level=sometimes"}, {"--zap-time-encoding=julian"}} {
		_, err := parseZap(t, bad...)
		require.Error(t, err, "%v", bad)
	}
}

// TestZapDevelAndOptionsShapeTheLogger: the zap flags change the one logger.
func TestZapDevelAndOptionsShapeTheLogger(t *testing.T) {
	var buf bytes.Buffer
	log, flush, err := New(Options{Level: "info", Format: FormatAuto, Devel: true}, &buf)
	require.NoError(t, err)
	log.V(1).Info("debug shown")
	log.Error(errors.New("boom"), "with a stack")
	flush()
	out := buf.String()
	require.Contains(t, out, "debug shown")
	require.False(t, json.Valid([]byte(strings.Split(out, "\n")[0])), "devel: text")
	require.Contains(t, out, "zapflags_test.go", "devel: stack traces from warn")

	buf.Reset()
	log, flush, err = New(Options{Level: "info", Format: FormatJSON, Devel: true, TimeEncoding: "epoch"}, &buf)
	require.NoError(t, err)
	log.Info("explicit json kept")
	flush()
	var entry map[string]any
	require.NoError(t, json.Unmarshal(bytes.TrimSpace(buf.Bytes()), &entry), buf.String())
	require.IsType(t, float64(0), entry["ts"], "epoch time")

	buf.Reset()
	log, flush, err = New(Options{Level: "info", Format: FormatJSON, StacktraceLevel: "error"}, &buf)
	require.NoError(t, err)
	log.Error(errors.New("boom"), "failed")
	flush()
	require.NoError(t, json.Unmarshal(bytes.TrimSpace(buf.Bytes()), &entry))
	require.Contains(t, entry, "stacktrace")
}
