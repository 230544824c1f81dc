package adminserve

import (
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// TokenFileName is the token file's name next to the context file.
const TokenFileName = "serve.token"

// minTokenLen is the shortest token accepted from a file (a generated one
// is 43 characters: 32 random bytes, base64url).
const minTokenLen = 32

// DefaultTokenPath is the token file beside the context file contextPath.
func DefaultTokenPath(contextPath string) string {
	return filepath.Join(filepath.Dir(contextPath), TokenFileName)
}

// LoadOrCreateToken reads the token in path, or, when there is no file,
// generates one (32 random bytes, base64url) and writes it with mode 0600
// (its directory 0700 when created); created says which. A file that
// group or others may read or write, that is not a regular file, or whose
// token is shorter than 32 characters or holds characters other than
// [A-Za-z0-9_-] is refused and left as it is.
func LoadOrCreateToken(path string) (token string, created bool, err error) {
	if path == "" {
		return "", false, errors.New("token file: no path")
	}
	tok, err := loadToken(path)
	if err == nil {
		return tok, false, nil
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return "", false, err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return "", false, fmt.Errorf("token file %s: %w", path, err)
	}
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", false, fmt.Errorf("generating a token: %w", err)
	}
	tok = base64.RawURLEncoding.EncodeToString(b)
	// The token is written whole to a temporary file, then linked to its
	// name: a link never replaces a file, so two serves starting at once
	// agree on the token of the one that linked first.
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return "", false, fmt.Errorf("token file %s: %w", path, err)
	}
	defer os.Remove(tmp.Name())
	if err := tmp.Chmod(0o600); err != nil {
		tmp.Close()
		return "", false, fmt.Errorf("token file %s: %w", path, err)
	}
	if _, err := tmp.WriteString(tok + "\n"); err != nil {
		tmp.Close()
		return "", false, fmt.Errorf("token file %s: %w", path, err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return "", false, fmt.Errorf("token file %s: %w", path, err)
	}
	if err := tmp.Close(); err != nil {
		return "", false, fmt.Errorf("token file %s: %w", path, err)
	}
	if err := os.Link(tmp.Name(), path); err != nil {
		if errors.Is(err, fs.ErrExist) {
			tok, err := loadToken(path)
			return tok, false, err
		}
		return "", false, fmt.Errorf("token file %s: %w", path, err)
	}
	return tok, true, nil
}

// loadToken reads and checks an existing token file; a missing file is an
// error wrapping fs.ErrNotExist.
func loadToken(path string) (string, error) {
	st, err := os.Lstat(path)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return "", err
		}
		return "", fmt.Errorf("token file %s: %w", path, err)
	}
	if !st.Mode().IsRegular() {
		return "", fmt.Errorf("token file %s is not a regular file (%s); remove it or pass another --token-file", path, st.Mode().Type())
	}
	if perm := st.Mode().Perm(); perm&0o077 != 0 {
		return "", fmt.Errorf("token file %s has mode %04o: group or others may use it; run chmod 600 %s (or remove it for a new token)", path, perm, path)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("token file %s: %w", path, err)
	}
	tok := strings.TrimSpace(string(b))
	if len(tok) < minTokenLen {
		return "", fmt.Errorf("token file %s: the token has %d characters, at least %d are required (remove the file for a new token)", path, len(tok), minTokenLen)
	}
	for _, r := range tok {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_') {
			return "", fmt.Errorf("token file %s: the token may hold only A-Z, a-z, 0-9, '-' and '_' (remove the file for a new token)", path)
		}
	}
	return tok, nil
}
