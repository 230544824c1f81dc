package carotation

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nstance-dev/nstance/internal/config"
	"github.com/nstance-dev/nstance/internal/layout"
	"github.com/nstance-dev/nstance/internal/pki"
	"github.com/nstance-dev/nstance/internal/secrets"
	"github.com/nstance-dev/nstance/pkg/objstore"
)

// Phase of a CA rotation.
type Phase string

// Phases. A cluster that never rotated has no state (PhaseNone).
const (
	PhaseNone       Phase = ""
	PhaseIntroduced Phase = "introduced"
	PhaseSwitched   Phase = "switched"
	PhaseRetired    Phase = "retired"
)

// RefreshGrace covers the time servers take to notice a phase change
// (they re-read the CA every few seconds) before retire may remove the old
// CA.
const RefreshGrace = 10 * time.Minute

// State is cluster/ca-rotation.json.
type State struct {
	Phase Phase `json:"phase"`
	// OldFingerprint and NewFingerprint (SHA-256 of the DER) name the
	// outgoing and incoming CA.
	OldFingerprint string `json:"old_fingerprint"`
	NewFingerprint string `json:"new_fingerprint"`
	// ClientValidity is the longest agent or operator certificate
	// validity of any shard when the rotation started: the gates use it.
	ClientValidity config.Duration `json:"client_validity"`
	IntroducedAt   time.Time       `json:"introduced_at"`
	// SwitchAfter: every client has renewed once since introduce.
	SwitchAfter time.Time  `json:"switch_after"`
	SwitchedAt  *time.Time `json:"switched_at,omitempty"`
	// RetireAfter: every certificate the old CA signed has expired.
	RetireAfter *time.Time `json:"retire_after,omitempty"`
	RetiredAt   *time.Time `json:"retired_at,omitempty"`
}

// Rotator runs the phases against object storage.
type Rotator struct {
	Objects objstore.Store
	// Secrets seals the CA keys; its ring must hold the key the servers use.
	Secrets   *secrets.Store
	Keys      layout.Keys
	ClusterID string
	Now       func() time.Time
}

func (r *Rotator) now() time.Time {
	if r.Now != nil {
		return r.Now().UTC()
	}
	return time.Now().UTC()
}

// ErrGate reports that a phase's gate has not passed yet.
var ErrGate = errors.New("not yet safe")

// Limits are the certificate validities of every shard, from their configs.
type Limits struct {
	ClientValidity time.Duration
	CAValidity     time.Duration
}

// LimitsFromConfigs reads every shard config (config/*.jsonc) and returns
// the longest agent/operator validity and CA validity (defaults applied).
func LimitsFromConfigs(ctx context.Context, objs objstore.Store, keys layout.Keys) (Limits, error) {
	infos, err := objs.List(ctx, keys.ConfigPrefix())
	if err != nil {
		return Limits{}, fmt.Errorf("listing shard configs: %w", err)
	}
	var l Limits
	for _, info := range infos {
		obj, err := objs.Get(ctx, info.Key)
		if err != nil {
			return Limits{}, fmt.Errorf("reading %s: %w", info.Key, err)
		}
		cfg, err := config.Parse(obj.Body)
		if err != nil {
			return Limits{}, fmt.Errorf("%s: %w", info.Key, err)
		}
		cfg.ApplyDefaults()
		c := cfg.Certificates
		l.ClientValidity = max(l.ClientValidity, c.AgentValidity.D(), c.OperatorValidity.D())
		l.CAValidity = max(l.CAValidity, c.CAValidity.D())
	}
	if len(infos) == 0 {
		return Limits{}, fmt.Errorf("no shard config under %s", keys.ConfigPrefix())
	}
	return l, nil
}

// state reads the rotation state and its ETag ("" when absent).
func (r *Rotator) state(ctx context.Context) (State, string, error) {
	obj, err := r.Objects.Get(ctx, r.Keys.CARotation())
	if errors.Is(err, objstore.ErrNotFound) {
		return State{}, "", nil
	}
	if err != nil {
		return State{}, "", fmt.Errorf("reading %s: %w", r.Keys.CARotation(), err)
	}
	var st State
	if err := json.Unmarshal(obj.Body, &st); err != nil {
		return State{}, "", fmt.Errorf("%s is not valid rotation state: %w", r.Keys.CARotation(), err)
	}
	switch st.Phase {
	case PhaseIntroduced, PhaseSwitched, PhaseRetired:
	default:
		return State{}, "", fmt.Errorf("%s has unknown phase %q", r.Keys.CARotation(), st.Phase)
	}
	return st, obj.ETag, nil
}

// saveState writes the state only if nobody changed it since it was read.
func (r *Rotator) saveState(ctx context.Context, st State, etag string) error {
	b, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return err
	}
	opts := objstore.PutOptions{IfMatch: etag, IfNoneMatch: etag == ""}
	if _, err := r.Objects.Put(ctx, r.Keys.CARotation(), append(b, '\n'), opts); err != nil {
		if errors.Is(err, objstore.ErrPreconditionFailed) {
			return fmt.Errorf("%s changed meanwhile (another rotate-ca running?); run the command again: %w", r.Keys.CARotation(), err)
		}
		return fmt.Errorf("writing %s: %w", r.Keys.CARotation(), err)
	}
	return nil
}

// loadCA loads a CA certificate (plain) and its sealed key.
func (r *Rotator) loadCA(ctx context.Context, certKey, keyKey string) (*pki.CA, error) {
	keyPEM, err := r.Secrets.Get(ctx, keyKey)
	if err != nil {
		return nil, err
	}
	obj, err := r.Objects.Get(ctx, certKey)
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", certKey, err)
	}
	ca, err := pki.LoadCA(obj.Body, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("%s / %s: %w", certKey, keyKey, err)
	}
	if td := ca.TrustDomain(); td != r.ClusterID {
		return nil, fmt.Errorf("%s names trust domain %q, want %q", certKey, td, r.ClusterID)
	}
	return ca, nil
}

func (r *Rotator) putBundle(ctx context.Context, certs ...*x509.Certificate) error {
	if _, err := r.Objects.Put(ctx, r.Keys.CABundle(), pki.EncodeBundle(certs...), objstore.PutOptions{}); err != nil {
		return fmt.Errorf("writing %s: %w", r.Keys.CABundle(), err)
	}
	return nil
}

// Introduce creates the new CA and adds it to the bundle. Run again while
// introduced it changes nothing; interrupted, it reuses what it wrote.
func (r *Rotator) Introduce(ctx context.Context, lim Limits) (State, error) {
	st, etag, err := r.state(ctx)
	if err != nil {
		return State{}, err
	}
	switch st.Phase {
	case PhaseIntroduced:
		return st, nil
	case PhaseSwitched:
		return st, errors.New("a rotation is switched but not retired: run `rotate-ca retire` first")
	}
	if lim.ClientValidity <= 0 || lim.CAValidity <= 0 {
		return State{}, errors.New("client and CA validity must be positive")
	}
	cur, err := r.loadCA(ctx, r.Keys.CACert(), r.Keys.CAKey())
	if err != nil {
		return State{}, fmt.Errorf("current cluster CA: %w", err)
	}
	next, err := r.ensureNext(ctx, cur, lim.CAValidity)
	if err != nil {
		return State{}, err
	}
	if err := r.putBundle(ctx, cur.Cert, next.Cert); err != nil {
		return State{}, err
	}
	now := r.now()
	st = State{Phase: PhaseIntroduced, OldFingerprint: pki.Fingerprint(cur.Cert), NewFingerprint: pki.Fingerprint(next.Cert),
		ClientValidity: config.Duration(lim.ClientValidity), IntroducedAt: now, SwitchAfter: now.Add(lim.ClientValidity)}
	return st, r.saveState(ctx, st, etag)
}

// ensureNext loads the incoming CA, creating its key (create-only) and
// certificate when missing.
func (r *Rotator) ensureNext(ctx context.Context, cur *pki.CA, validity time.Duration) (*pki.CA, error) {
	keyPEM, err := r.Secrets.Get(ctx, r.Keys.NextCAKey())
	if errors.Is(err, objstore.ErrNotFound) {
		_, priv, gerr := ed25519.GenerateKey(rand.Reader)
		if gerr != nil {
			return nil, fmt.Errorf("generating the new CA key: %w", gerr)
		}
		p, merr := pki.MarshalPrivateKeyPEM(priv)
		if merr != nil {
			return nil, merr
		}
		if perr := r.Secrets.Put(ctx, r.Keys.NextCAKey(), p, objstore.PutOptions{IfNoneMatch: true}); perr != nil && !errors.Is(perr, objstore.ErrPreconditionFailed) {
			return nil, fmt.Errorf("storing the new CA key: %w", perr)
		}
		keyPEM, err = r.Secrets.Get(ctx, r.Keys.NextCAKey())
	}
	if err != nil {
		return nil, fmt.Errorf("new CA key: %w", err)
	}
	etag := ""
	if obj, err := r.Objects.Get(ctx, r.Keys.NextCACert()); err == nil {
		if ca, lerr := pki.LoadCA(obj.Body, keyPEM); lerr == nil && ca.TrustDomain() == r.ClusterID && !ca.Cert.Equal(cur.Cert) {
			return ca, nil
		}
		etag = obj.ETag // a leftover that does not belong to the key: replaced
	} else if !errors.Is(err, objstore.ErrNotFound) {
		return nil, fmt.Errorf("reading %s: %w", r.Keys.NextCACert(), err)
	}
	signer, err := pki.ParsePrivateKeyPEM(keyPEM)
	if err != nil {
		return nil, fmt.Errorf("new CA key: %w", err)
	}
	ed, ok := signer.(ed25519.PrivateKey)
	if !ok {
		return nil, fmt.Errorf("new CA key is %T, want Ed25519", signer)
	}
	ca, err := pki.SelfSignCA(r.ClusterID, ed, validity, r.now())
	if err != nil {
		return nil, err
	}
	// Conditional, so two runs at once end with one certificate: the loser
	// takes the winner's.
	_, err = r.Objects.Put(ctx, r.Keys.NextCACert(), ca.CertPEM, objstore.PutOptions{IfNoneMatch: etag == "", IfMatch: etag})
	if errors.Is(err, objstore.ErrPreconditionFailed) {
		obj, gerr := r.Objects.Get(ctx, r.Keys.NextCACert())
		if gerr != nil {
			return nil, fmt.Errorf("reading %s: %w", r.Keys.NextCACert(), gerr)
		}
		return pki.LoadCA(obj.Body, keyPEM)
	}
	if err != nil {
		return nil, fmt.Errorf("writing %s: %w", r.Keys.NextCACert(), err)
	}
	return ca, nil
}

// Switch makes the new CA the signer. Gated by SwitchAfter unless force.
func (r *Rotator) Switch(ctx context.Context, force bool) (State, error) {
	st, etag, err := r.state(ctx)
	if err != nil {
		return State{}, err
	}
	switch st.Phase {
	case PhaseSwitched:
		return st, r.cleanNext(ctx)
	case PhaseIntroduced:
	default:
		return st, errors.New("no rotation is introduced: run `rotate-ca introduce` first")
	}
	now := r.now()
	if !force && now.Before(st.SwitchAfter) {
		return st, fmt.Errorf("%w: clients that registered or renewed before %s may trust only the old CA until they renew; switch after %s (or --force once every client holds the bundle)",
			ErrGate, st.IntroducedAt.Format(time.RFC3339), st.SwitchAfter.Format(time.RFC3339))
	}
	next, err := r.loadCA(ctx, r.Keys.NextCACert(), r.Keys.NextCAKey())
	if err != nil {
		return st, fmt.Errorf("incoming CA: %w", err)
	}
	if pki.Fingerprint(next.Cert) != st.NewFingerprint {
		return st, fmt.Errorf("%s is not the CA this rotation introduced (fingerprint %s, want %s)", r.Keys.NextCACert(), pki.Fingerprint(next.Cert), st.NewFingerprint)
	}
	obj, err := r.Objects.Get(ctx, r.Keys.CACert())
	if err != nil {
		return st, fmt.Errorf("reading %s: %w", r.Keys.CACert(), err)
	}
	curCert, err := pki.ParseCertificatePEM(obj.Body)
	if err != nil {
		return st, fmt.Errorf("%s: %w", r.Keys.CACert(), err)
	}
	switch pki.Fingerprint(curCert) {
	case st.OldFingerprint:
		// Keep the outgoing certificate for status and retire.
		if _, err := r.Objects.Put(ctx, r.Keys.PreviousCACert(), obj.Body, objstore.PutOptions{}); err != nil {
			return st, fmt.Errorf("writing %s: %w", r.Keys.PreviousCACert(), err)
		}
	case st.NewFingerprint:
		// An interrupted switch already wrote it.
	default:
		return st, fmt.Errorf("%s is neither the old nor the new CA of this rotation", r.Keys.CACert())
	}
	keyPEM, err := pki.MarshalPrivateKeyPEM(next.Key)
	if err != nil {
		return st, err
	}
	// Key first, then certificate: a server that reads between the two
	// sees a pair that does not match and keeps what it has until both are
	// written.
	if err := r.Secrets.Put(ctx, r.Keys.CAKey(), keyPEM, objstore.PutOptions{}); err != nil {
		return st, fmt.Errorf("installing the new CA key: %w", err)
	}
	if _, err := r.Objects.Put(ctx, r.Keys.CACert(), next.CertPEM, objstore.PutOptions{}); err != nil {
		return st, fmt.Errorf("installing the new CA certificate: %w", err)
	}
	retireAfter := now.Add(st.ClientValidity.D() + RefreshGrace)
	st.Phase, st.SwitchedAt, st.RetireAfter = PhaseSwitched, &now, &retireAfter
	if err := r.saveState(ctx, st, etag); err != nil {
		return st, err
	}
	return st, r.cleanNext(ctx)
}

func (r *Rotator) cleanNext(ctx context.Context) error {
	for _, k := range []string{r.Keys.NextCAKey(), r.Keys.NextCACert()} {
		if err := r.Objects.Delete(ctx, k); err != nil {
			return fmt.Errorf("deleting %s: %w", k, err)
		}
	}
	return nil
}

// Retire removes the old CA from the bundle. Gated by RetireAfter unless force.
func (r *Rotator) Retire(ctx context.Context, force bool) (State, error) {
	st, etag, err := r.state(ctx)
	if err != nil {
		return State{}, err
	}
	switch st.Phase {
	case PhaseRetired:
		return st, r.Objects.Delete(ctx, r.Keys.PreviousCACert())
	case PhaseSwitched:
	default:
		return st, errors.New("no rotation is switched: run `rotate-ca switch` first")
	}
	now := r.now()
	if !force && st.RetireAfter != nil && now.Before(*st.RetireAfter) {
		return st, fmt.Errorf("%w: certificates signed by the old CA before the switch at %s may still be in use; retire after %s (or --force once every client and server has renewed)",
			ErrGate, st.SwitchedAt.Format(time.RFC3339), st.RetireAfter.Format(time.RFC3339))
	}
	cur, err := r.loadCA(ctx, r.Keys.CACert(), r.Keys.CAKey())
	if err != nil {
		return st, fmt.Errorf("current cluster CA: %w", err)
	}
	if pki.Fingerprint(cur.Cert) != st.NewFingerprint {
		return st, fmt.Errorf("%s is not the CA this rotation switched to", r.Keys.CACert())
	}
	if err := r.putBundle(ctx, cur.Cert); err != nil {
		return st, err
	}
	st.Phase, st.RetiredAt = PhaseRetired, &now
	if err := r.saveState(ctx, st, etag); err != nil {
		return st, err
	}
	return st, r.Objects.Delete(ctx, r.Keys.PreviousCACert())
}

// CertInfo describes one CA certificate.
type CertInfo struct {
	Fingerprint string    `json:"fingerprint"`
	Subject     string    `json:"subject"`
	NotAfter    time.Time `json:"not_after"`
	// Role is "old", "new" or "" for a cluster that is not rotating.
	Role string `json:"role,omitempty"`
}

// Status is what `rotate-ca status` shows.
type Status struct {
	State State `json:"state"`
	// Signer is cluster/ca.crt: what servers sign with.
	Signer CertInfo `json:"signer"`
	// Bundle is every CA servers and clients trust.
	Bundle []CertInfo `json:"bundle"`
	// NextStep is the command that moves the rotation on ("" when none).
	NextStep string `json:"next_step"`
	// Waiting says what the next step still waits for ("" when it may run).
	Waiting string `json:"waiting,omitempty"`
}

// Status reads the rotation state and the CAs it involves.
func (r *Rotator) Status(ctx context.Context) (Status, error) {
	st, _, err := r.state(ctx)
	if err != nil {
		return Status{}, err
	}
	out := Status{State: st}
	role := func(fp string) string {
		switch {
		case st.Phase == PhaseNone:
			return ""
		case fp == st.OldFingerprint:
			return "old"
		case fp == st.NewFingerprint:
			return "new"
		}
		return ""
	}
	info := func(c *x509.Certificate) CertInfo {
		fp := pki.Fingerprint(c)
		return CertInfo{Fingerprint: fp, Subject: c.Subject.CommonName, NotAfter: c.NotAfter.UTC(), Role: role(fp)}
	}
	obj, err := r.Objects.Get(ctx, r.Keys.CACert())
	if err != nil {
		return Status{}, fmt.Errorf("reading %s: %w", r.Keys.CACert(), err)
	}
	signer, err := pki.ParseCertificatePEM(obj.Body)
	if err != nil {
		return Status{}, fmt.Errorf("%s: %w", r.Keys.CACert(), err)
	}
	out.Signer = info(signer)
	bundle := []*x509.Certificate{signer}
	if b, err := r.Objects.Get(ctx, r.Keys.CABundle()); err == nil {
		if bundle, err = pki.ParseCertificatesPEM(b.Body); err != nil {
			return Status{}, fmt.Errorf("%s: %w", r.Keys.CABundle(), err)
		}
	} else if !errors.Is(err, objstore.ErrNotFound) {
		return Status{}, fmt.Errorf("reading %s: %w", r.Keys.CABundle(), err)
	}
	for _, c := range bundle {
		out.Bundle = append(out.Bundle, info(c))
	}
	now := r.now()
	switch st.Phase {
	case PhaseNone, PhaseRetired:
		out.NextStep = "rotate-ca introduce"
	case PhaseIntroduced:
		out.NextStep = "rotate-ca switch"
		if now.Before(st.SwitchAfter) {
			out.Waiting = fmt.Sprintf("clients that registered or renewed before %s may hold only the old CA until they renew (until %s)",
				st.IntroducedAt.Format(time.RFC3339), st.SwitchAfter.Format(time.RFC3339))
		}
	case PhaseSwitched:
		out.NextStep = "rotate-ca retire"
		if st.RetireAfter != nil && now.Before(*st.RetireAfter) {
			out.Waiting = fmt.Sprintf("certificates the old CA signed before the switch may be in use until %s", st.RetireAfter.Format(time.RFC3339))
		}
	}
	return out, nil
}
