package pki

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/util/wait"
)

// RenewingCert keeps a certificate that a process presents fresh: it issues
// a new one once RenewFraction of the current one's validity has passed and
// swaps it in for new handshakes (GetCertificate), so a long-running server
// never presents an expired certificate and never restarts for it.
type RenewingCert struct {
	issue func(now time.Time) (tls.Certificate, error)
	now   func() time.Time
	log   logr.Logger
	// renewFraction of the validity after which a new certificate is issued.
	renewFraction float64
	cur           atomic.Pointer[tls.Certificate]
	// renewAt of cur; certificates are backdated for clock skew, so the
	// schedule runs from when each was issued, not from NotBefore.
	renewAt atomic.Int64
	renewed atomic.Int64
	// kick asks Run to renew at once (RenewNow).
	kick chan struct{}
}

// NewRenewingCert issues the first certificate with issue and returns the
// renewer. fraction (0 < fraction < 1) is when to renew, e.g. 2/3 of the
// validity; now is time.Now when nil.
func NewRenewingCert(issue func(now time.Time) (tls.Certificate, error), fraction float64, now func() time.Time, log logr.Logger) (*RenewingCert, error) {
	if fraction <= 0 || fraction >= 1 {
		return nil, errors.New("pki: renew fraction must be between 0 and 1")
	}
	if now == nil {
		now = time.Now
	}
	r := &RenewingCert{issue: issue, now: now, log: log, renewFraction: fraction, kick: make(chan struct{}, 1)}
	c, at, err := r.issueLeaf()
	if err != nil {
		return nil, err
	}
	r.cur.Store(c)
	r.renewAt.Store(at.UnixNano())
	return r, nil
}

func (r *RenewingCert) issueLeaf() (*tls.Certificate, time.Time, error) {
	now := r.now()
	c, err := r.issue(now)
	if err != nil {
		return nil, time.Time{}, err
	}
	if c.Leaf == nil {
		return nil, time.Time{}, errors.New("pki: issued certificate has no parsed leaf")
	}
	return &c, now.Add(time.Duration(float64(c.Leaf.NotAfter.Sub(now)) * r.renewFraction)), nil
}

// Current is the certificate presented now.
func (r *RenewingCert) Current() *tls.Certificate { return r.cur.Load() }

// Renewals is how many times the certificate was replaced.
func (r *RenewingCert) Renewals() int64 { return r.renewed.Load() }

// GetCertificate is a tls.Config.GetCertificate.
func (r *RenewingCert) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	return r.cur.Load(), nil
}

// RenewNow makes Run issue a replacement at once, e.g. because the CA that
// signs it changed. It does not wait for the new certificate.
func (r *RenewingCert) RenewNow() {
	select {
	case r.kick <- struct{}{}:
	default:
	}
}

// RenewAt is when the current certificate is due for renewal.
func (r *RenewingCert) RenewAt() time.Time { return time.Unix(0, r.renewAt.Load()) }

// Run renews until ctx ends. A failed issue is retried with backoff (up to
// a tenth of the remaining validity between attempts, at most a minute)
// and logged; the current certificate stays in use meanwhile.
func (r *RenewingCert) Run(ctx context.Context) {
	for {
		if d := r.RenewAt().Sub(r.now()); d > 0 {
			t := time.NewTimer(d)
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-t.C:
				continue
			case <-r.kick:
				t.Stop()
			}
		}
		if !r.renewOnce(ctx) {
			return
		}
	}
}

// renewOnce issues a replacement, retrying until it succeeds or ctx ends.
func (r *RenewingCert) renewOnce(ctx context.Context) bool {
	left := r.cur.Load().Leaf.NotAfter.Sub(r.now())
	b := wait.Backoff{Duration: time.Second, Factor: 2, Jitter: 0.1, Steps: 1 << 30, Cap: min(time.Minute, max(left/10, time.Second))}
	for {
		c, at, err := r.issueLeaf()
		if err == nil {
			r.renewAt.Store(at.UnixNano())
			old := r.cur.Swap(c)
			r.renewed.Add(1)
			r.log.Info("renewed certificate", "subject", c.Leaf.Subject.CommonName, "serial", c.Leaf.SerialNumber.String(),
				"notAfter", c.Leaf.NotAfter, "previousNotAfter", old.Leaf.NotAfter)
			return true
		}
		d := b.Step()
		r.log.Error(err, "renewing certificate failed; retrying", "in", d, "currentNotAfter", r.cur.Load().Leaf.NotAfter)
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			return false
		case <-t.C:
		}
	}
}

// issuedAt is when a certificate issued by this package was signed: its
// NotBefore is back-dated by the clock-skew allowance, which is not part of
// its intended lifetime (a certificate shorter than the allowance counts
// from NotBefore).
func issuedAt(cert *x509.Certificate) time.Time {
	if at := cert.NotBefore.Add(clockSkew); at.Before(cert.NotAfter) {
		return at
	}
	return cert.NotBefore
}

// Lifetime is a certificate's intended validity: from its signing to NotAfter.
func Lifetime(cert *x509.Certificate) time.Duration { return cert.NotAfter.Sub(issuedAt(cert)) }

// RenewAt is when fraction (0 < fraction < 1) of a certificate's lifetime,
// counted from its signing, has passed: the time to renew it.
func RenewAt(cert *x509.Certificate, fraction float64) time.Time {
	return issuedAt(cert).Add(time.Duration(float64(Lifetime(cert)) * fraction))
}
