package contextfile

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"sigs.k8s.io/yaml"

	"github.com/nstance-dev/nstance/internal/admin/shard"
	"github.com/nstance-dev/nstance/internal/atomicfile"
)

// EnvPath names the file when --admin-config is not given.
const EnvPath = "NSTANCE_ADMIN_CONFIG"

// DefaultPath is $XDG_CONFIG_HOME/nstance/admin.yaml (~/.config/nstance/admin.yaml
// on Linux; the platform's user config directory elsewhere).
func DefaultPath() (string, error) {
	dir, err := os.UserConfigDir()
	if err != nil {
		return "", fmt.Errorf("finding the context file: %w (set %s or --admin-config)", err, EnvPath)
	}
	return filepath.Join(dir, "nstance", "admin.yaml"), nil
}

// Context is one named set of connection settings. Relative file paths are
// relative to the directory of the context file.
type Context struct {
	Name string `json:"name"`
	// Servers maps shard ids to their Operator API host:port.
	Servers map[string]string `json:"servers,omitempty"`
	CACert  string            `json:"ca-cert,omitempty"`
	Cert    string            `json:"cert,omitempty"`
	Key     string            `json:"key,omitempty"`
}

// File is the whole context file.
type File struct {
	CurrentContext string    `json:"current-context,omitempty"`
	Contexts       []Context `json:"contexts"`
}

// ErrNotExist is returned by Load when the file is missing.
var ErrNotExist = errors.New("context file does not exist")

// Load reads and validates the file at path.
func Load(path string) (*File, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("%w: %s (create one with `nstance-admin context set NAME --servers ...`)", ErrNotExist, path)
	}
	if err != nil {
		return nil, fmt.Errorf("reading context file: %w", err)
	}
	var f File
	if err := yaml.UnmarshalStrict(b, &f); err != nil {
		return nil, fmt.Errorf("context file %s: %w", path, err)
	}
	if err := f.Validate(); err != nil {
		return nil, fmt.Errorf("context file %s: %w", path, err)
	}
	return &f, nil
}

// LoadOrEmpty is Load that returns an empty file when none exists yet.
func LoadOrEmpty(path string) (*File, error) {
	f, err := Load(path)
	if errors.Is(err, ErrNotExist) {
		return &File{}, nil
	}
	return f, err
}

// Validate checks names, servers and the current context.
func (f *File) Validate() error {
	seen := map[string]bool{}
	for i, c := range f.Contexts {
		if err := ValidateName(c.Name); err != nil {
			return fmt.Errorf("contexts[%d]: %w", i, err)
		}
		if seen[c.Name] {
			return fmt.Errorf("context %q is defined twice", c.Name)
		}
		seen[c.Name] = true
		for _, sh := range sortedKeys(c.Servers) {
			if err := shard.ValidateServer(sh, c.Servers[sh]); err != nil {
				return fmt.Errorf("context %q: servers: %w", c.Name, err)
			}
		}
	}
	if f.CurrentContext != "" && !seen[f.CurrentContext] {
		return fmt.Errorf("current-context %q is not one of the contexts (%s)", f.CurrentContext, strings.Join(f.Names(), ", "))
	}
	return nil
}

// ValidateName checks a context name: 1-63 characters of letters, digits, '-', '_' and '.'.
func ValidateName(name string) error {
	if name == "" || len(name) > 63 {
		return fmt.Errorf("context name %q: want 1 to 63 characters", name)
	}
	for _, r := range name {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_' || r == '.') {
			return fmt.Errorf("context name %q: only letters, digits, '-', '_' and '.' are allowed", name)
		}
	}
	return nil
}

// Names returns the context names, sorted.
func (f *File) Names() []string {
	out := make([]string, 0, len(f.Contexts))
	for _, c := range f.Contexts {
		out = append(out, c.Name)
	}
	sort.Strings(out)
	return out
}

// Get returns the named context.
func (f *File) Get(name string) (*Context, error) {
	for i := range f.Contexts {
		if f.Contexts[i].Name == name {
			return &f.Contexts[i], nil
		}
	}
	known := "none defined"
	if len(f.Contexts) > 0 {
		known = "known: " + strings.Join(f.Names(), ", ")
	}
	return nil, fmt.Errorf("no context named %q (%s)", name, known)
}

// Current returns the context named name, or the current context when name is empty.
func (f *File) Current(name string) (*Context, error) {
	if name == "" {
		name = f.CurrentContext
	}
	if name == "" {
		return nil, errors.New("no current context: pick one with `nstance-admin context use NAME` or --context")
	}
	return f.Get(name)
}

// Upsert replaces the context with c's name, or adds c. The contexts stay
// sorted by name so the file diffs well.
func (f *File) Upsert(c Context) {
	if i := slices.IndexFunc(f.Contexts, func(x Context) bool { return x.Name == c.Name }); i >= 0 {
		f.Contexts[i] = c
	} else {
		f.Contexts = append(f.Contexts, c)
	}
	sort.Slice(f.Contexts, func(i, j int) bool { return f.Contexts[i].Name < f.Contexts[j].Name })
}

// Delete removes a context; deleting the current one leaves no current context.
func (f *File) Delete(name string) error {
	if _, err := f.Get(name); err != nil {
		return err
	}
	f.Contexts = slices.DeleteFunc(f.Contexts, func(x Context) bool { return x.Name == name })
	if f.CurrentContext == name {
		f.CurrentContext = ""
	}
	return nil
}

// Save validates f and writes it atomically to path with mode 0600, creating
// the directory (0700) when needed.
func (f *File) Save(path string) error {
	if err := f.Validate(); err != nil {
		return err
	}
	b, err := yaml.Marshal(f)
	if err != nil {
		return fmt.Errorf("encoding context file: %w", err)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return fmt.Errorf("creating the directory of %s: %w", path, err)
	}
	return atomicfile.WritePath(path, b, 0o600)
}

// Resolve returns p made absolute against the directory of the context file
// at path ("" stays "").
func Resolve(path, p string) string {
	if p == "" || filepath.IsAbs(p) {
		return p
	}
	return filepath.Join(filepath.Dir(path), p)
}

func sortedKeys(m map[string]string) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}
