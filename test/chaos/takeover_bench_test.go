package chaos

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// writeNonceMarkers puts n used-nonce markers of the shard straight into
// dev-s3's directory (dev-s3 serves plain files), as if n agents had
// registered.
func writeNonceMarkers(tb testing.TB, s3Dir string, n int) {
	tb.Helper()
	dir := filepath.Join(s3Dir, "shard", shard, "nonces")
	require.NoError(tb, os.MkdirAll(dir, 0o755))
	now := time.Now().UTC()
	for i := range n {
		jti := fmt.Sprintf("bench-%08d", i)
		body := fmt.Sprintf(`{"jti":%q,"kind":"agent","sub":"i-%08d","tenant":"default","used_at":%q,"expires_at":%q,"used_by":"srv-1"}`,
			jti, i, now.Format(time.RFC3339), now.Add(15*time.Minute).Format(time.RFC3339))
		require.NoError(tb, os.WriteFile(filepath.Join(dir, jti), []byte(body), 0o644))
	}
}

func healthy(host string) bool {
	resp, err := http.Get("http://" + host + ":8990/health")
	if err != nil {
		return false
	}
	_ = resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// BenchmarkTakeover measures a leadership handover: the leader is stopped
// with SIGTERM (it releases its lease) and the time until the standby
// answers an Operator call is taken, with no nonce markers and with
// 100,000 in the bucket (CHAOS_MARKERS overrides the larger count). Since
// leadership start lists no markers, the two should not differ beyond
// noise. Reported as ms/takeover (median of b.N handovers in the log).
func BenchmarkTakeover(b *testing.B) {
	many := 100000
	if v := os.Getenv("CHAOS_MARKERS"); v != "" {
		n, err := strconv.Atoi(v)
		require.NoError(b, err)
		many = n
	}
	for _, markers := range []int{0, many} {
		b.Run(fmt.Sprintf("markers=%d", markers), func(b *testing.B) {
			st := newStack(b, 0)
			writeNonceMarkers(b, filepath.Join(st.dir, "dev-s3"), markers)
			st.startServer("srv-1", st.net+"1")
			st.startServer("srv-2", st.net+"2")
			p := startPoller(st.operatorClients())
			defer p.Stop()
			var took []time.Duration
			b.ResetTimer()
			for range b.N {
				b.StopTimer()
				leader := st.leader(p, time.Now(), 60*time.Second)
				standby := st.other(leader)
				require.Eventually(b, func() bool { return healthy(standby.host) }, 60*time.Second, 20*time.Millisecond, "standby ready")
				b.StartTimer()
				began := time.Now()
				leader.signal(b, syscall.SIGTERM)
				require.Eventually(b, func() bool { return p.servedSince(standby, began) }, 60*time.Second, 5*time.Millisecond)
				took = append(took, time.Since(began))
				b.StopTimer()
				<-leader.proc.Done
				st.launch(leader)
				b.StartTimer()
			}
			b.StopTimer()
			slices.Sort(took)
			med := took[len(took)/2]
			b.ReportMetric(float64(med.Microseconds())/1000, "ms/takeover(median)")
			b.Logf("markers=%d: %d handovers, median %s, min %s, max %s", markers, len(took), med, took[0], took[len(took)-1])
		})
	}
}
