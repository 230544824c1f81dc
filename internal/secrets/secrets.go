package secrets

import (
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"regexp"
	"strings"

	"github.com/nstance-dev/nstance/pkg/objstore"
)

// KeySize is the length of an encryption key in bytes.
const KeySize = 32

const (
	envelopeVersion = 1
	algorithm       = "AES-256-GCM"
)

// ErrUnknownKey reports an envelope sealed with a key the keyring does not hold.
var ErrUnknownKey = errors.New("envelope was sealed with a key this keyring does not hold")

// Key is one 32-byte encryption key with its id.
type Key struct {
	ID string
	// Printable is set when all 32 key bytes are printable ASCII: the key is
	// text someone typed (a passphrase), not 32 random bytes. It is accepted
	// (the dev stack uses such a key) but the server warns loudly outside
	// development.
	Printable bool
	aead      cipher.AEAD
}

// ParseKey turns key material into a Key. Accepted forms: exactly 32 raw
// bytes, 64 hex characters, or base64 (standard or URL, padded or not) of 32
// bytes, e.g. `head -c 32 /dev/urandom | base64`. Surrounding whitespace (a
// trailing newline in a key file) is ignored unless the material is already
// 32 bytes long. Anything that is not one of these forms is refused; the
// error never echoes the material.
func ParseKey(material []byte) (*Key, error) {
	raw, err := decodeMaterial(material)
	if err != nil {
		return nil, err
	}
	printable := true
	for _, b := range raw {
		if b < 0x20 || b > 0x7e {
			printable = false
			break
		}
	}
	block, err := aes.NewCipher(raw)
	if err != nil {
		return nil, fmt.Errorf("creating AES cipher: %w", err)
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		return nil, fmt.Errorf("creating GCM: %w", err)
	}
	sum := sha256.Sum256(append([]byte("nstance-key-id\x00"), raw...))
	return &Key{ID: hex.EncodeToString(sum[:8]), Printable: printable, aead: aead}, nil
}

func decodeMaterial(m []byte) ([]byte, error) {
	if len(m) == KeySize {
		return append([]byte(nil), m...), nil
	}
	s := strings.TrimSpace(string(m))
	if len(s) == KeySize {
		return []byte(s), nil
	}
	if len(s) == 2*KeySize {
		if b, err := hex.DecodeString(s); err == nil {
			return b, nil
		}
	}
	for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.RawStdEncoding, base64.URLEncoding, base64.RawURLEncoding} {
		if b, err := enc.DecodeString(s); err == nil && len(b) == KeySize {
			return b, nil
		}
	}
	return nil, fmt.Errorf("encryption key must be %d raw bytes, 64 hex characters or base64 of %d random bytes (got %d bytes of another form)", KeySize, KeySize, len(s))
}

// Keyring seals with its current key and opens with the current or any previous key.
type Keyring struct {
	current  *Key
	previous []*Key
}

// NewKeyring returns a keyring sealing with current.
func NewKeyring(current *Key, previous ...*Key) (*Keyring, error) {
	if current == nil {
		return nil, errors.New("keyring needs a current key")
	}
	return &Keyring{current: current, previous: previous}, nil
}

// CurrentID is the id of the key new envelopes are sealed with.
func (k *Keyring) CurrentID() string { return k.current.ID }

// PrintableIDs lists the ids of the keys (current first) that are printable
// text rather than random bytes.
func (k *Keyring) PrintableIDs() []string {
	var out []string
	for _, key := range append([]*Key{k.current}, k.previous...) {
		if key.Printable {
			out = append(out, key.ID)
		}
	}
	return out
}

type envelope struct {
	Version    int    `json:"v"`
	Algorithm  string `json:"alg"`
	KeyID      string `json:"kid"`
	Nonce      []byte `json:"nonce"`
	Ciphertext []byte `json:"ct"`
}

// Seal encrypts plaintext for the secret called name.
func (k *Keyring) Seal(name string, plaintext []byte) ([]byte, error) {
	nonce := make([]byte, k.current.aead.NonceSize())
	if _, err := rand.Read(nonce); err != nil {
		return nil, fmt.Errorf("reading random nonce: %w", err)
	}
	env := envelope{
		Version:    envelopeVersion,
		Algorithm:  algorithm,
		KeyID:      k.current.ID,
		Nonce:      nonce,
		Ciphertext: k.current.aead.Seal(nil, nonce, plaintext, []byte(name)),
	}
	return json.Marshal(env)
}

// Open decrypts an envelope produced by Seal for the same name.
func (k *Keyring) Open(name string, data []byte) ([]byte, error) {
	var env envelope
	if err := json.Unmarshal(data, &env); err != nil {
		return nil, fmt.Errorf("secret %q is not an encrypted envelope: %w", name, err)
	}
	if env.Version != envelopeVersion || env.Algorithm != algorithm {
		return nil, fmt.Errorf("secret %q: unsupported envelope version %d algorithm %q", name, env.Version, env.Algorithm)
	}
	var key *Key
	for _, c := range append([]*Key{k.current}, k.previous...) {
		if c.ID == env.KeyID {
			key = c
			break
		}
	}
	if key == nil {
		return nil, fmt.Errorf("secret %q, key id %q: %w", name, env.KeyID, ErrUnknownKey)
	}
	if len(env.Nonce) != key.aead.NonceSize() {
		return nil, fmt.Errorf("secret %q: nonce is %d bytes, want %d", name, len(env.Nonce), key.aead.NonceSize())
	}
	pt, err := key.aead.Open(nil, env.Nonce, env.Ciphertext, []byte(name))
	if err != nil {
		return nil, fmt.Errorf("secret %q: decryption failed (tampered, renamed or wrong key): %w", name, err)
	}
	return pt, nil
}

// Source says where one key comes from.
type Source struct {
	// Provider is "env", "file", "aws-secrets-manager", "aws-ssm" or
	// "gcp-secret-manager".
	Provider string
	// Env is the variable name for provider env.
	Env string
	// File is the path for provider file.
	File string
	// SecretID, VersionStage and VersionID name a Secrets Manager secret
	// version (provider aws-secrets-manager); SecretID
	// (projects/P/secrets/S) and VersionID (default latest) a Google Secret
	// Manager version (provider gcp-secret-manager).
	SecretID, VersionStage, VersionID string
	// Parameter is the SSM parameter name, optionally name:version
	// (provider aws-ssm).
	Parameter string
	// Region overrides the AWS region (AWS providers).
	Region string
}

// Remote providers.
const (
	ProviderAWSSecretsManager = "aws-secrets-manager"
	ProviderAWSSSM            = "aws-ssm"
	ProviderGCPSecretManager  = "gcp-secret-manager"
)

// gcpSecretName is a Google Secret Manager secret's resource name.
var gcpSecretName = regexp.MustCompile(`^projects/[^/]+/secrets/[^/]+$`)

// ValidGCPSecretID reports whether id names a Google Secret Manager secret
// as provider gcp-secret-manager wants it: projects/PROJECT/secrets/NAME
// (the version goes in version_id).
func ValidGCPSecretID(id string) bool { return gcpSecretName.MatchString(id) }

// ByProvider serves each remote provider with its own Remote.
type ByProvider map[string]Remote

// Fetch implements Remote.
func (b ByProvider) Fetch(ctx context.Context, src Source) ([]byte, error) {
	r, ok := b[src.Provider]
	if !ok || r == nil {
		return nil, fmt.Errorf("provider %s is not available here", src.Provider)
	}
	return r.Fetch(ctx, src)
}

// Remote reads key material from a secrets service (the AWS providers).
type Remote interface {
	// Fetch returns the raw material src names.
	Fetch(ctx context.Context, src Source) ([]byte, error)
}

// Loader reads keys from the environment, files and a Remote.
type Loader struct {
	// Getenv reads variables; os.Getenv when nil.
	Getenv func(string) string
	// Remote serves the AWS and Google providers; nil refuses them.
	Remote Remote
}

// Load reads and parses the key a Source names. getenv is os.Getenv when nil.
func Load(src Source, getenv func(string) string) (*Key, error) {
	return Loader{Getenv: getenv}.Load(context.Background(), src)
}

// Load reads and parses the key a Source names.
func (l Loader) Load(ctx context.Context, src Source) (*Key, error) {
	getenv := l.Getenv
	if getenv == nil {
		getenv = os.Getenv
	}
	var material []byte
	switch src.Provider {
	case "env":
		v := getenv(src.Env)
		if v == "" {
			return nil, fmt.Errorf("encryption key: environment variable %s is not set", src.Env)
		}
		material = []byte(v)
	case "file":
		b, err := os.ReadFile(src.File)
		if err != nil {
			return nil, fmt.Errorf("encryption key: reading %s: %w", src.File, err)
		}
		material = b
	case ProviderAWSSecretsManager, ProviderAWSSSM, ProviderGCPSecretManager:
		if l.Remote == nil {
			return nil, fmt.Errorf("encryption key: provider %s is not available here", src.Provider)
		}
		b, err := l.Remote.Fetch(ctx, src)
		if err != nil {
			return nil, fmt.Errorf("encryption key: %w", err)
		}
		material = b
	default:
		return nil, fmt.Errorf("encryption key: unknown provider %q (want env, file, %s, %s or %s)", src.Provider, ProviderAWSSecretsManager, ProviderAWSSSM, ProviderGCPSecretManager)
	}
	key, err := ParseKey(material)
	if err != nil {
		return nil, fmt.Errorf("encryption key from %s: %w", describe(src), err)
	}
	return key, nil
}

// describe names a source in errors without its material.
func describe(src Source) string {
	switch src.Provider {
	case ProviderAWSSecretsManager, ProviderGCPSecretManager:
		return fmt.Sprintf("%s secret %q", src.Provider, src.SecretID)
	case ProviderAWSSSM:
		return fmt.Sprintf("%s parameter %q", src.Provider, src.Parameter)
	}
	return src.Provider
}

// LoadKeyring loads the current key and every previous one.
func LoadKeyring(current Source, previous []Source, getenv func(string) string) (*Keyring, error) {
	return Loader{Getenv: getenv}.Keyring(context.Background(), current, previous)
}

// Keyring loads the current key and every previous one.
func (l Loader) Keyring(ctx context.Context, current Source, previous []Source) (*Keyring, error) {
	cur, err := l.Load(ctx, current)
	if err != nil {
		return nil, err
	}
	var prev []*Key
	for i, s := range previous {
		k, err := l.Load(ctx, s)
		if err != nil {
			return nil, fmt.Errorf("previous key %d: %w", i, err)
		}
		prev = append(prev, k)
	}
	return NewKeyring(cur, prev...)
}

// Store keeps encrypted secrets in object storage. The object key doubles as
// the authenticated name of the secret.
type Store struct {
	Objects objstore.Store
	Ring    *Keyring
}

// Get reads and decrypts the secret at key. Missing secrets return an error
// wrapping objstore.ErrNotFound.
func (s *Store) Get(ctx context.Context, key string) ([]byte, error) {
	obj, err := s.Objects.Get(ctx, key)
	if err != nil {
		return nil, fmt.Errorf("reading secret %s: %w", key, err)
	}
	return s.Ring.Open(key, obj.Body)
}

// Put encrypts plaintext and writes it to key with the given conditions.
func (s *Store) Put(ctx context.Context, key string, plaintext []byte, opts objstore.PutOptions) error {
	env, err := s.Ring.Seal(key, plaintext)
	if err != nil {
		return err
	}
	if _, err := s.Objects.Put(ctx, key, env, opts); err != nil {
		return fmt.Errorf("writing secret %s: %w", key, err)
	}
	return nil
}

// EnvelopeKeyID is the id of the key an envelope was sealed with.
func EnvelopeKeyID(data []byte) (string, error) {
	var env envelope
	if err := json.Unmarshal(data, &env); err != nil {
		return "", fmt.Errorf("not an encrypted envelope: %w", err)
	}
	if env.Version != envelopeVersion || env.Algorithm != algorithm || env.KeyID == "" {
		return "", fmt.Errorf("unsupported envelope version %d algorithm %q key id %q", env.Version, env.Algorithm, env.KeyID)
	}
	return env.KeyID, nil
}

// ResealReport counts what ResealAll did.
type ResealReport struct {
	// Total envelopes found under the prefix.
	Total int `json:"total"`
	// Resealed under the current key by this run.
	Resealed int `json:"resealed"`
	// AlreadyCurrent were sealed with the current key before this run.
	AlreadyCurrent int `json:"already_current"`
	// Keys lists every envelope re-sealed by this run.
	Keys []string `json:"resealed_keys,omitempty"`
}

// Reseal rewrites the envelope at key under the current key unless it
// already is; the write is conditional on the object being unchanged since
// it was read, and is retried from the read when it was changed meanwhile
// (by someone sealing with the same ring, the result is then current).
func (s *Store) Reseal(ctx context.Context, key string) (resealed bool, err error) {
	for attempt := 0; attempt < 5; attempt++ {
		obj, err := s.Objects.Get(ctx, key)
		if err != nil {
			return false, fmt.Errorf("reading secret %s: %w", key, err)
		}
		kid, err := EnvelopeKeyID(obj.Body)
		if err != nil {
			return false, fmt.Errorf("secret %s: %w", key, err)
		}
		if kid == s.Ring.CurrentID() {
			return false, nil
		}
		pt, err := s.Ring.Open(key, obj.Body)
		if err != nil {
			return false, err
		}
		env, err := s.Ring.Seal(key, pt)
		if err != nil {
			return false, err
		}
		_, err = s.Objects.Put(ctx, key, env, objstore.PutOptions{IfMatch: obj.ETag})
		if errors.Is(err, objstore.ErrPreconditionFailed) {
			continue
		}
		if err != nil {
			return false, fmt.Errorf("writing secret %s: %w", key, err)
		}
		return true, nil
	}
	return false, fmt.Errorf("secret %s kept changing while it was re-sealed", key)
}

// ResealAll re-seals every envelope under prefix with the current key. It
// is idempotent and resumable: envelopes already under the current key are
// left alone, so a run interrupted midway is finished by running it again.
// Nothing is written until an envelope has been opened and re-sealed, so a
// key the ring does not hold stops the run with the envelope unchanged.
func (s *Store) ResealAll(ctx context.Context, prefix string) (ResealReport, error) {
	var rep ResealReport
	infos, err := s.Objects.List(ctx, prefix)
	if err != nil {
		return rep, fmt.Errorf("listing secrets under %s: %w", prefix, err)
	}
	for _, info := range infos {
		rep.Total++
		done, err := s.Reseal(ctx, info.Key)
		if errors.Is(err, objstore.ErrNotFound) {
			rep.Total-- // deleted since the listing
			continue
		}
		if err != nil {
			return rep, err
		}
		if done {
			rep.Resealed++
			rep.Keys = append(rep.Keys, info.Key)
		} else {
			rep.AlreadyCurrent++
		}
	}
	return rep, nil
}
