package app

import (
	"crypto/x509"
	"time"

	"github.com/nstance-dev/nstance/internal/server/metrics"
)

// metricsProcess is what the server metrics read from the app at scrape
// time.
func (a *App) metricsProcess() metrics.Process {
	return metrics.Process{
		ServerID: a.o.ServerID, Shard: a.o.Shard,
		Cluster: func() string {
			a.mu.Lock()
			defer a.mu.Unlock()
			if a.cfg == nil {
				return ""
			}
			return a.cfg.Cluster.ID
		},
		Ready: a.Ready,
		ShardElection: func() (bool, int64) {
			a.mu.Lock()
			el := a.shardEl
			a.mu.Unlock()
			if el == nil {
				return false, 0
			}
			st := el.Status()
			return st.Leading, st.Term
		},
		ClusterElection: func() (bool, int64) {
			a.mu.Lock()
			el := a.clusterEl
			a.mu.Unlock()
			if el == nil {
				return false, 0
			}
			st := el.Status()
			return st.Leading, st.Term
		},
		ServerCertNotAfter: func() time.Time {
			a.mu.Lock()
			rc := a.serverCerts
			a.mu.Unlock()
			if rc == nil {
				return time.Time{}
			}
			c := rc.Current()
			if c == nil {
				return time.Time{}
			}
			leaf := c.Leaf
			if leaf == nil && len(c.Certificate) > 0 {
				var err error
				if leaf, err = x509.ParseCertificate(c.Certificate[0]); err != nil {
					return time.Time{}
				}
			}
			if leaf == nil {
				return time.Time{}
			}
			return leaf.NotAfter
		},
		CANotAfter: func() time.Time {
			a.mu.Lock()
			t := a.trust
			a.mu.Unlock()
			if t == nil || t.Signer() == nil || t.Signer().Cert == nil {
				return time.Time{}
			}
			return t.Signer().Cert.NotAfter
		},
	}
}

// Metrics returns the server's metrics (collectors and interceptors).
func (a *App) Metrics() *metrics.Server { return a.metrics }
