package identity

import (
	"bytes"
	"crypto/ed25519"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"os"

	"github.com/nstance-dev/nstance/internal/atomicfile"
)

// Renewal: the server asks for a new identity key (PendingPublicKeyPEM
// creates NextKeyFile once and reuses it until a certificate for it is
// installed), then delivers its certificate (InstallRenewed). The swap is
// crash-safe: the certificate is first stored as NextCertFile, then the key
// and the certificate are renamed over KeyFile and CertFile and the
// directory synced. Open finishes a swap a crash interrupted, so the pair on
// disk always matches: either the old one or the new one.

// PendingPublicKeyPEM returns the PKIX PEM of the renewal key, generating
// and storing it (0600, synced) the first time.
func (d *Dir) PendingPublicKeyPEM() (string, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	k, err := d.loadOrCreateKey(NextKeyFile)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		// An unreadable renewal key is only a pending one: start over.
		if rerr := atomicfile.RemovePath(d.Path(NextKeyFile)); rerr != nil {
			return "", rerr
		}
		k, err = d.loadOrCreateKey(NextKeyFile)
	}
	if err != nil {
		return "", err
	}
	der, err := x509.MarshalPKIXPublicKey(k.Public())
	if err != nil {
		return "", fmt.Errorf("identity: encoding public key: %w", err)
	}
	return string(pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der})), nil
}

// InstallRenewed stores a renewed certificate (PEM, optionally followed by
// the CA chain) for the pending renewal key and makes the pair the agent's
// identity, so the next handshake presents it. It reports false when
// content is the certificate already in use. The certificate must carry the
// same identity (URI SANs) as the current one.
func (d *Dir) InstallRenewed(content []byte) (bool, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	leafBlock, rest := pem.Decode(content)
	if leafBlock == nil || leafBlock.Type != "CERTIFICATE" {
		return false, errors.New("identity: renewed certificate: no CERTIFICATE PEM block")
	}
	cert, err := x509.ParseCertificate(leafBlock.Bytes)
	if err != nil {
		return false, fmt.Errorf("identity: renewed certificate: %w", err)
	}
	curPEM, err := os.ReadFile(d.Path(CertFile))
	if err != nil {
		return false, fmt.Errorf("identity: reading current certificate: %w", err)
	}
	cur, err := parseCert(curPEM)
	if err != nil {
		return false, fmt.Errorf("identity: current certificate: %w", err)
	}
	if bytes.Equal(cur.Raw, cert.Raw) {
		return false, nil
	}
	if !sameURIs(cur, cert) {
		return false, fmt.Errorf("identity: renewed certificate names %v, the current one %v", cert.URIs, cur.URIs)
	}
	next, err := d.loadKey(NextKeyFile)
	if err != nil {
		return false, fmt.Errorf("identity: renewed certificate arrived without a pending key: %w", err)
	}
	if !next.Public().(ed25519.PublicKey).Equal(cert.PublicKey) {
		return false, errors.New("identity: renewed certificate does not match the pending renewal key")
	}
	if chain := bytes.TrimSpace(rest); len(chain) > 0 {
		if _, err := parseCert(chain); err != nil {
			return false, fmt.Errorf("identity: renewed CA chain: %w", err)
		}
		if err := atomicfile.WritePath(d.Path(CAChainFile), append(chain, '\n'), 0o644); err != nil {
			return false, err
		}
	}
	certPEM := pem.EncodeToMemory(leafBlock)
	if err := atomicfile.WritePath(d.Path(NextCertFile), certPEM, 0o644); err != nil {
		return false, err
	}
	if err := d.swapIn(true); err != nil {
		return false, err
	}
	d.cached = nil
	return true, nil
}

// swapIn renames the pending pair over the current one (withKey: the key
// too) and syncs the directory.
func (d *Dir) swapIn(withKey bool) error {
	root, err := os.OpenRoot(d.path)
	if err != nil {
		return fmt.Errorf("identity: %w", err)
	}
	defer root.Close()
	if withKey {
		if err := root.Rename(NextKeyFile, KeyFile); err != nil {
			return fmt.Errorf("identity: installing renewed key: %w", err)
		}
	}
	if err := root.Rename(NextCertFile, CertFile); err != nil {
		return fmt.Errorf("identity: installing renewed certificate: %w", err)
	}
	if err := atomicfile.SyncDir(root, "."); err != nil {
		return fmt.Errorf("identity: %w", err)
	}
	return nil
}

// finishRenewal completes or discards a swap a crash interrupted: a stored
// NextCertFile goes in with the key it belongs to (NextKeyFile, or KeyFile
// when that rename already happened); one that matches neither is removed.
func (d *Dir) finishRenewal() error {
	b, err := os.ReadFile(d.Path(NextCertFile))
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("identity: reading %s: %w", NextCertFile, err)
	}
	cert, err := parseCert(b)
	if err == nil {
		if k, kerr := d.loadKey(NextKeyFile); kerr == nil && k.Public().(ed25519.PublicKey).Equal(cert.PublicKey) {
			return d.swapIn(true)
		}
		if k, kerr := d.loadKey(KeyFile); kerr == nil && k.Public().(ed25519.PublicKey).Equal(cert.PublicKey) {
			return d.swapIn(false)
		}
	}
	return atomicfile.RemovePath(d.Path(NextCertFile))
}

func sameURIs(a, b *x509.Certificate) bool {
	if len(a.URIs) != len(b.URIs) {
		return false
	}
	for i := range a.URIs {
		if a.URIs[i].String() != b.URIs[i].String() {
			return false
		}
	}
	return true
}
