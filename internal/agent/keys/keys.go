package keys

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"

	"github.com/nstance-dev/nstance/internal/keytype"
	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

// Suffix is the file name suffix of stored private keys.
const Suffix = ".key"

// DefaultMode is the permission of key files when none is configured.
const DefaultMode fs.FileMode = 0o600

var namePattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$`)

// ValidateName checks that a key name is usable as a file name stem.
func ValidateName(name string) error {
	if !namePattern.MatchString(name) || strings.Contains(name, "..") {
		return fmt.Errorf("invalid key name %q: want 1-63 letters, digits, '.', '_' or '-', starting with a letter or digit", name)
	}
	return nil
}

// Generate creates a private key of type t.
func Generate(t nstancev1.KeyType) (crypto.Signer, error) {
	switch t {
	case nstancev1.KeyType_KEY_TYPE_ED25519:
		_, k, err := ed25519.GenerateKey(rand.Reader)
		return k, err
	case nstancev1.KeyType_KEY_TYPE_ECDSA_P256:
		return ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	case nstancev1.KeyType_KEY_TYPE_ECDSA_P384:
		return ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	case nstancev1.KeyType_KEY_TYPE_RSA_2048:
		return rsa.GenerateKey(rand.Reader, 2048)
	case nstancev1.KeyType_KEY_TYPE_RSA_4096:
		return rsa.GenerateKey(rand.Reader, 4096)
	default:
		return nil, fmt.Errorf("unsupported key type %s", t)
	}
}

// PublicPEM encodes the public half of key as PKIX PEM.
func PublicPEM(pub crypto.PublicKey) (string, error) {
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		return "", fmt.Errorf("encoding public key: %w", err)
	}
	return string(pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der})), nil
}

// ParsePublicPEM parses a PKIX PEM public key.
func ParsePublicPEM(s string) (crypto.PublicKey, error) {
	b, _ := pem.Decode([]byte(s))
	if b == nil || b.Type != "PUBLIC KEY" {
		return nil, errors.New("no PUBLIC KEY PEM block")
	}
	pub, err := x509.ParsePKIXPublicKey(b.Bytes)
	if err != nil {
		return nil, fmt.Errorf("parsing public key: %w", err)
	}
	return pub, nil
}

// Store keeps generated keys in one directory.
type Store struct {
	dir  string
	mode fs.FileMode
	mu   sync.Mutex
}

// NewStore returns a Store for dir (created with mode 0700 when missing);
// key files get mode (DefaultMode when 0).
func NewStore(dir string, mode fs.FileMode) (*Store, error) {
	if dir == "" {
		return nil, errors.New("keys: directory is required")
	}
	if mode == 0 {
		mode = DefaultMode
	}
	if mode&^fs.ModePerm != 0 || mode&0o400 == 0 {
		return nil, fmt.Errorf("keys: invalid key file mode %#o", mode)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("keys: creating %s: %w", dir, err)
	}
	return &Store{dir: dir, mode: mode}, nil
}

// Path is the file holding the private key name.
func (s *Store) Path(name string) string { return filepath.Join(s.dir, name+Suffix) }

// Names lists the keys currently stored, sorted.
func (s *Store) Names() ([]string, error) {
	ents, err := os.ReadDir(s.dir)
	if err != nil {
		return nil, fmt.Errorf("keys: listing %s: %w", s.dir, err)
	}
	var out []string
	for _, e := range ents {
		name, ok := strings.CutSuffix(e.Name(), Suffix)
		if ok && e.Type().IsRegular() && ValidateName(name) == nil {
			out = append(out, name)
		}
	}
	sort.Strings(out)
	return out, nil
}

// Load reads the stored private key name.
func (s *Store) Load(name string) (crypto.Signer, error) {
	if err := ValidateName(name); err != nil {
		return nil, err
	}
	b, err := os.ReadFile(s.Path(name))
	if err != nil {
		return nil, fmt.Errorf("keys: reading %s: %w", name, err)
	}
	blk, _ := pem.Decode(b)
	if blk == nil || blk.Type != "PRIVATE KEY" {
		return nil, fmt.Errorf("keys: %s holds no PRIVATE KEY PEM block", name)
	}
	k, err := x509.ParsePKCS8PrivateKey(blk.Bytes)
	if err != nil {
		return nil, fmt.Errorf("keys: parsing %s: %w", name, err)
	}
	signer, ok := k.(crypto.Signer)
	if !ok {
		return nil, fmt.Errorf("keys: %s is a %T, which cannot sign", name, k)
	}
	return signer, nil
}

// Apply makes the store hold exactly the keys of req: keys of the right type
// are kept, missing or mistyped (or unreadable) keys are generated, and keys
// not listed are removed. It returns the public key of every listed key, in
// request order. Invalid specs fail the whole request before anything changes.
func (s *Store) Apply(req *nstancev1.KeyGenRequest) ([]*nstancev1.PublicKey, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	want := map[string]bool{}
	for _, spec := range req.GetKeys() {
		if err := ValidateName(spec.GetName()); err != nil {
			return nil, err
		}
		if want[spec.GetName()] {
			return nil, fmt.Errorf("key %q is listed twice", spec.GetName())
		}
		if spec.GetType() == nstancev1.KeyType_KEY_TYPE_UNSPECIFIED || nstancev1.KeyType_name[int32(spec.GetType())] == "" {
			return nil, fmt.Errorf("key %q: unsupported key type %s", spec.GetName(), spec.GetType())
		}
		want[spec.GetName()] = true
	}
	out := make([]*nstancev1.PublicKey, 0, len(req.GetKeys()))
	for _, spec := range req.GetKeys() {
		key, err := s.Load(spec.GetName())
		if err != nil || keytype.Of(key.Public()) != spec.GetType() {
			if key, err = Generate(spec.GetType()); err != nil {
				return nil, fmt.Errorf("key %q: %w", spec.GetName(), err)
			}
			if err := s.save(spec.GetName(), key); err != nil {
				return nil, err
			}
		}
		pubPEM, err := PublicPEM(key.Public())
		if err != nil {
			return nil, fmt.Errorf("key %q: %w", spec.GetName(), err)
		}
		out = append(out, &nstancev1.PublicKey{Name: spec.GetName(), Type: spec.GetType(), PublicKeyPem: pubPEM})
	}
	have, err := s.Names()
	if err != nil {
		return nil, err
	}
	for _, name := range have {
		if !want[name] {
			if err := os.Remove(s.Path(name)); err != nil && !errors.Is(err, fs.ErrNotExist) {
				return nil, fmt.Errorf("keys: removing unneeded key %s: %w", name, err)
			}
		}
	}
	return out, nil
}

func (s *Store) save(name string, key crypto.Signer) error {
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return fmt.Errorf("keys: encoding %s: %w", name, err)
	}
	data := pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})
	var rnd [6]byte
	if _, err := rand.Read(rnd[:]); err != nil {
		return fmt.Errorf("keys: temporary name: %w", err)
	}
	tmp := filepath.Join(s.dir, "."+name+".tmp-"+hex.EncodeToString(rnd[:]))
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("keys: writing %s: %w", name, err)
	}
	_, err = f.Write(data)
	if err == nil {
		err = f.Chmod(s.mode)
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, s.Path(name))
	}
	if err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("keys: writing %s: %w", name, err)
	}
	return nil
}
