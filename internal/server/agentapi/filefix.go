package agentapi

import (
	"context"
	"fmt"
	"slices"
	"time"

	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

// Remedy is what the server does about the files an agent reports in
// error (FILE_STATE_ERROR): certificate files get their certificate
// issued again, and the file set is pushed again (forced, even when its
// hash did not change) so the agent retries writing every file.
type Remedy struct {
	// Resend: push the instance's files again.
	Resend bool
	// Reissue names the keys whose certificate is issued again (sorted).
	Reissue []string
	// Paths are the reported paths in error (sorted).
	Paths []string
}

// FileRemedy decides the remedy for a report's file status: certKeys maps
// the certificate file paths of the instance's plan to their key. A path
// in error that the plan does not hold (any more) is left alone: the
// next delivery removes it.
func FileRemedy(files []*nstancev1.FileStatus, certKeys map[string]string, planned map[string]bool) Remedy {
	var r Remedy
	for _, f := range files {
		if f.GetState() != nstancev1.FileState_FILE_STATE_ERROR || !planned[f.GetPath()] {
			continue
		}
		r.Resend = true
		r.Paths = append(r.Paths, f.GetPath())
		if k, ok := certKeys[f.GetPath()]; ok && !slices.Contains(r.Reissue, k) {
			r.Reissue = append(r.Reissue, k)
		}
	}
	slices.Sort(r.Paths)
	slices.Sort(r.Reissue)
	return r
}

// hasFileErrors reports whether a report has a file in error.
func hasFileErrors(files []*nstancev1.FileStatus) bool {
	return slices.ContainsFunc(files, func(f *nstancev1.FileStatus) bool { return f.GetState() == nstancev1.FileState_FILE_STATE_ERROR })
}

// RemedyFiles acts on the files a report says are in error (FileRemedy):
// reissues the certificates of certificate files, then forces a push of
// the instance's files. Called for reports with a file in error, at most
// once per RepushInterval per instance (the agent keeps reporting an
// error until a push fixes it).
func (s *Server) RemedyFiles(ctx context.Context, ref Ref, files []*nstancev1.FileStatus) (Remedy, error) {
	p, err := s.plan(ctx, ref)
	if err != nil {
		return Remedy{}, err
	}
	certKeys, planned := map[string]string{}, map[string]bool{}
	for _, f := range p.Files {
		planned[f.Path] = true
		if f.Key != "" {
			certKeys[f.Path] = f.Key
		}
	}
	r := FileRemedy(files, certKeys, planned)
	if !r.Resend {
		return r, nil
	}
	if len(r.Reissue) > 0 {
		if err := s.reissue(ctx, ref, p, r.Reissue); err != nil {
			return r, err
		}
	}
	s.o.Log.Info("files reported in error: pushing them again", "instance", ref.InstanceID, "paths", r.Paths, "reissued", r.Reissue)
	s.hub.notify(ref.InstanceID, true)
	return r, nil
}

// reissue issues the certificates of the named keys again, whatever their
// age (keys not submitted yet are skipped: their certificate is pending).
func (s *Server) reissue(ctx context.Context, ref Ref, p *Plan, names []string) error {
	stored, err := s.o.Keys.Keys(ctx, ref)
	if err != nil {
		return fmt.Errorf("reading stored keys: %w", err)
	}
	for _, spec := range p.Keys {
		cs := spec.GetCertificate()
		sk, ok := stored[spec.GetName()]
		if cs == nil || !ok || sk.Type != spec.GetType() || !slices.Contains(names, spec.GetName()) {
			continue
		}
		pub, err := parsePublicKey(sk.PublicKeyPEM)
		if err != nil {
			return fmt.Errorf("stored public key %s unusable: %w", spec.GetName(), err)
		}
		certPEM, nb, na, err := s.o.Signer.Sign(ctx, ref, cs, pub)
		if err != nil {
			return fmt.Errorf("issuing certificate %s again: %w", spec.GetName(), err)
		}
		if _, err := s.o.Keys.PutCertificate(ctx, ref, spec.GetName(), sk.PublicKeyPEM, certPEM, hashMessage(cs), nb, na); err != nil {
			return fmt.Errorf("storing certificate %s: %w", spec.GetName(), err)
		}
	}
	return nil
}

// maxFileFixGap bounds the backoff between remedies of files that stay in
// error (a path the agent always refuses, a full disk).
const maxFileFixGap = 10 * time.Minute

// fileFixGap is the wait before the next remedy after one that waited
// gap: doubled, from base up to maxFileFixGap.
func fileFixGap(gap, base time.Duration) time.Duration {
	if gap < base {
		return base
	}
	return min(2*gap, max(maxFileFixGap, base))
}

// fileFixDue reports whether the files an instance reports in error may be
// remedied now: the first time at once, then after a gap that doubles from
// base (RepushInterval) up to maxFileFixGap while the errors stay, so a
// file that cannot be written does not have the whole set pushed every
// interval for ever. A report without errors resets it (fileFixReset).
func (h *hub) fileFixDue(id string, now time.Time, base time.Duration) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	st := h.byID[id]
	if st == nil || (!st.lastFileFix.IsZero() && now.Sub(st.lastFileFix) < st.fileFixGap) {
		return false
	}
	st.lastFileFix, st.fileFixGap = now, fileFixGap(st.fileFixGap, base)
	return true
}

// fileFixReset forgets the backoff once the instance reports no file in error.
func (h *hub) fileFixReset(id string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if st := h.byID[id]; st != nil {
		st.lastFileFix, st.fileFixGap = time.Time{}, 0
	}
}
