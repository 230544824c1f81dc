package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"io"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// archive builds a chart-like .tgz whose entries carry the time when.
func archive(t *testing.T, when time.Time) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	zw.Header.Comment, zw.Header.ModTime = "Helm", when
	tw := tar.NewWriter(zw)
	for _, f := range []struct{ name, body string }{{"c/Chart.yaml", "name: c\n"}, {"c/values.yaml", "a: 1\n"}, {"c/templates/x.yaml", "kind: X\n"}} {
		require.NoError(t, tw.WriteHeader(&tar.Header{Name: f.name, Mode: 0o644, Size: int64(len(f.body)), ModTime: when, Uname: "someone"}))
		_, err := tw.Write([]byte(f.body))
		require.NoError(t, err)
	}
	require.NoError(t, tw.Close())
	require.NoError(t, zw.Close())
	return buf.Bytes()
}

func entries(t *testing.T, tgz []byte) (names, bodies []string, times []time.Time) {
	t.Helper()
	zr, err := gzip.NewReader(bytes.NewReader(tgz))
	require.NoError(t, err)
	require.Equal(t, "Helm", zr.Header.Comment)
	tr := tar.NewReader(zr)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return
		}
		require.NoError(t, err)
		b, err := io.ReadAll(tr)
		require.NoError(t, err)
		names, bodies, times = append(names, h.Name), append(bodies, string(b)), append(times, h.ModTime)
	}
}

// TestNormalize: two packagings at different times give the same bytes,
// with every entry's name, order and content kept and the commit's time.
func TestNormalize(t *testing.T) {
	commit := time.Unix(1764201600, 0).UTC()
	a, err := Normalize(archive(t, time.Now()), commit)
	require.NoError(t, err)
	b, err := Normalize(archive(t, time.Now().Add(time.Hour)), commit)
	require.NoError(t, err)
	require.Equal(t, a, b)
	names, bodies, times := entries(t, a)
	require.Equal(t, []string{"c/Chart.yaml", "c/values.yaml", "c/templates/x.yaml"}, names)
	require.Equal(t, []string{"name: c\n", "a: 1\n", "kind: X\n"}, bodies)
	for _, tm := range times {
		require.True(t, tm.Equal(commit), tm)
	}
	_, err = Normalize([]byte("not gzip"), commit)
	require.ErrorContains(t, err, "not a gzip archive")
}
