package shardconn

import (
	"context"
	"fmt"
	"time"

	"github.com/nstance-dev/nstance/internal/operator/bootstrap"
	"github.com/nstance-dev/nstance/internal/pki"
	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

// renewAt is when a certificate should be renewed: after the given fraction
// of its lifetime.
func renewAt(notBefore, notAfter time.Time, fraction float64) time.Time {
	if fraction <= 0 || fraction >= 1 {
		fraction = 2.0 / 3
	}
	life := notAfter.Sub(notBefore)
	return notBefore.Add(time.Duration(float64(life) * fraction))
}

func (m *Manager) renewLoop(ctx context.Context) {
	retry := time.Second
	for {
		leaf := m.Certificate().Leaf
		wait := time.Until(renewAt(leaf.NotBefore, leaf.NotAfter, m.opts.RenewFraction))
		timer := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			timer.Stop()
			return
		case <-timer.C:
		}
		if err := m.Renew(ctx); err != nil {
			if ctx.Err() != nil {
				return
			}
			m.opts.Log.Error(err, "certificate renewal failed; retrying", "in", retry, "notAfter", leaf.NotAfter)
			select {
			case <-ctx.Done():
				return
			case <-time.After(retry):
			}
			retry = min(retry*2, time.Minute)
			continue
		}
		retry = time.Second
	}
}

// Renew asks the first healthy shard for a fresh certificate for the same
// key, stores it and uses it for new connections.
func (m *Manager) Renew(ctx context.Context) error {
	cur := m.Certificate()
	var lastErr error = fmt.Errorf("no shard is reachable")
	for _, id := range m.ids {
		if !m.Healthy(id) {
			continue
		}
		c, err := m.Client(id)
		if err != nil {
			lastErr = err
			continue
		}
		cctx, cancel := context.WithTimeout(ctx, 15*time.Second)
		resp, err := c.RenewCertificate(cctx, &nstancev1.RenewCertificateRequest{PublicKeyPem: string(cur.PublicKeyPEM)})
		cancel()
		if err != nil {
			lastErr = fmt.Errorf("RenewCertificate on shard %s: %w", id, err)
			continue
		}
		// The server's CA chain is its trusted bundle: during a cluster CA
		// rotation it brings the new CA before servers switch to it, and
		// drops the old one once it is retired.
		caPEM := cur.CAPEM
		if chain := []byte(resp.GetCaChainPem()); len(chain) > 0 {
			certs, err := pki.ParseCertificatesPEM(chain)
			if err == nil {
				err = pki.CheckClusterBundle(certs, m.opts.ClusterID)
			}
			if err != nil {
				return fmt.Errorf("CA chain from shard %s: %w", id, err)
			}
			caPEM = chain
		}
		next, err := bootstrap.Parse(caPEM, []byte(resp.GetCertificatePem()), cur.KeyPEM, m.opts.ClusterID, time.Now())
		if err != nil {
			return fmt.Errorf("renewed certificate from shard %s: %w", id, err)
		}
		next.PublicKeyPEM = cur.PublicKeyPEM
		if m.opts.StoreCert != nil {
			if err := m.opts.StoreCert(ctx, next.CertPEM, next.KeyPEM, next.CAPEM); err != nil {
				return fmt.Errorf("store renewed certificate: %w", err)
			}
		}
		m.mu.Lock()
		m.creds = next
		m.mu.Unlock()
		m.opts.Log.Info("operator certificate renewed", "shard", id, "notAfter", next.Leaf.NotAfter)
		return nil
	}
	return lastErr
}
