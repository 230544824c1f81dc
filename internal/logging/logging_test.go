package logging

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap/zapcore"
)

func TestParseLevel(t *testing.T) {
	for in, want := range map[string]zapcore.Level{
		"": zapcore.InfoLevel, "debug": zapcore.DebugLevel, "INFO": zapcore.InfoLevel,
		"warn": zapcore.WarnLevel, "warning": zapcore.WarnLevel, "error": zapcore.ErrorLevel,
		"0": zapcore.Level(0), "4": zapcore.Level(-4),
	} {
		got, err := ParseLevel(in)
		require.NoError(t, err, in)
		require.Equal(t, want, got, in)
	}
	for _, bad := range []string{"verbose", "-1", "128", "inf"} {
		_, err := ParseLevel(bad)
		require.Error(t, err, bad)
	}
}

func TestFormatsAndNoStackTraces(t *testing.T) {
	var buf bytes.Buffer
	log, flush, err := New(Options{Level: "info", Format: "json"}, &buf)
	require.NoError(t, err)
	log.Error(errors.New("config.json: line 3: invalid character"), "reading config", "path", "config.json")
	log.V(1).Info("hidden at info")
	flush()
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	require.Len(t, lines, 1, buf.String())
	var entry map[string]any
	require.NoError(t, json.Unmarshal([]byte(lines[0]), &entry))
	require.Equal(t, "error", entry["level"])
	require.Equal(t, "reading config", entry["msg"])
	require.NotContains(t, entry, "stacktrace")

	buf.Reset()
	log, flush, err = New(Options{Level: "1", Format: "text"}, &buf)
	require.NoError(t, err)
	log.V(1).Info("shown at verbosity 1")
	log.Error(errors.New("boom"), "failed")
	flush()
	out := buf.String()
	require.Contains(t, out, "shown at verbosity 1")
	require.Contains(t, out, "ERROR")
	require.NotContains(t, out, "goroutine")
	require.False(t, json.Valid([]byte(strings.Split(out, "\n")[0])), "text format must not be JSON")

	// A buffer is not a terminal, so auto means json.
	buf.Reset()
	log, flush, err = New(Defaults(), &buf)
	require.NoError(t, err)
	log.Info("auto")
	flush()
	require.True(t, json.Valid(bytes.TrimSpace(buf.Bytes())), buf.String())
}

func TestBadOptionsAreRefused(t *testing.T) {
	_, _, err := New(Options{Level: "loud"}, nil)
	require.ErrorContains(t, err, `log level "loud"`)
	_, _, err = New(Options{Format: "xml"}, nil)
	require.ErrorContains(t, err, `log format "xml"`)
}

func TestBindFlagsEnvThenFlag(t *testing.T) {
	env := map[string]string{"DEV_K8S_LOG_LEVEL": "debug", "DEV_K8S_LOG_FORMAT": "text"}
	var o Options
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	o.BindFlags(fs, "DEV_K8S", func(k string) string { return env[k] })
	require.NoError(t, fs.Parse(nil))
	require.Equal(t, Options{Level: "debug", Format: "text"}, o)

	fs = flag.NewFlagSet("x", flag.ContinueOnError)
	o.BindFlags(fs, "DEV_K8S", func(k string) string { return env[k] })
	require.NoError(t, fs.Parse([]string{"--log-level", "warn"}))
	require.Equal(t, "warn", o.Level)
}
