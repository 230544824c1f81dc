package pprofserve

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/go-logr/logr"
	"github.com/stretchr/testify/require"
)

func TestServesProfilesUntilStopped(t *testing.T) {
	addr, stop, err := Start("127.0.0.1:0", logr.Discard())
	require.NoError(t, err)
	resp, err := http.Get("http://" + addr + "/debug/pprof/goroutine?debug=1")
	require.NoError(t, err)
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.True(t, strings.Contains(string(body), "goroutine profile"), string(body))
	stop()
	_, err = http.Get("http://" + addr + "/debug/pprof/")
	require.Error(t, err, "nothing serves after stop")

	_, _, err = Start("127.0.0.1:bad", logr.Discard())
	require.ErrorContains(t, err, "binding pprof address")
}
