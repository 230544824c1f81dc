package config

import (
	"strconv"
	"time"

	"github.com/nstance-dev/nstance/internal/layout"
	"github.com/nstance-dev/nstance/pkg/objstore"
)

// Sources of a secret file (TemplateFile.Source).
const (
	FileSourceCluster           = "cluster"
	FileSourceAWSSecretsManager = "aws-secrets-manager"
	FileSourceAWSSSM            = "aws-ssm"
	FileSourceGCPSecretManager  = "gcp-secret-manager"
)

// Template file kinds whose content comes from outside the config.
const (
	FileKindSecret  = "secret"
	FileKindStorage = "storage"
)

// MaxSecretFileMode is the loosest mode a secret file may ask for: owner
// read/write (the agent caps secrets at it too).
const MaxSecretFileMode = 0o600

// FileSources tunes how the contents of secret and storage files are read.
// A value read from a source is reused for CacheTTL; after that it is read
// again, and while that fails the last value keeps being delivered (the
// failure is reported) until it is MaxStale old.
type FileSources struct {
	// CacheTTL is how long a value read is reused: a rotated secret or a
	// changed object reaches instances within it (default 5m).
	CacheTTL Duration `json:"cache_ttl"`
	// MaxStale is how old the last good value may grow while reading it
	// again fails (default 1h; at least cache_ttl). Beyond it the file is
	// reported missing: the agent keeps the copy it holds, new instances go
	// without it.
	MaxStale Duration `json:"max_stale"`
}

// File source defaults.
const (
	DefaultFileCacheTTL = 5 * time.Minute
	DefaultFileMaxStale = time.Hour
)

func (f *FileSources) applyDefaults() {
	setDur(&f.CacheTTL, DefaultFileCacheTTL)
	setDur(&f.MaxStale, max(DefaultFileMaxStale, f.CacheTTL.D()))
}

func (f FileSources) validate(ch *checker) {
	if f.CacheTTL <= 0 {
		ch.add("shard.file_sources.cache_ttl", "must be positive, got %s", f.CacheTTL.D())
	}
	if f.MaxStale < f.CacheTTL {
		ch.add("shard.file_sources.max_stale", "must not be shorter than cache_ttl (%s), got %s", f.CacheTTL.D(), f.MaxStale.D())
	}
}

// SecretSource returns the source of a secret file, "cluster" when unset.
func (f TemplateFile) SecretSource() string {
	if f.Source == "" {
		return FileSourceCluster
	}
	return f.Source
}

// checkFileSource checks the fields a file of kind secret or storage reads
// its content with, and that other kinds set none of them. fk is the file's
// key path (templates.<t>.files.<f>).
func checkFileSource(ch *checker, fk string, f TemplateFile) {
	set := func(name, v string) {
		if v != "" {
			ch.add(fk+"."+name, "for kind secret only")
		}
	}
	switch f.Kind {
	case FileKindSecret:
		checkSecretSource(ch, fk, f)
	case FileKindStorage:
		if f.Object == "" {
			ch.add(fk+".object", "required for kind storage")
		} else if err := layout.CheckTemplateObject(f.Object); err != nil {
			ch.add(fk+".object", "%v", err)
		} else if err := objstore.ValidateKey(f.Object); err != nil {
			ch.add(fk+".object", "%v", err)
		}
		if f.Content != "" {
			ch.add(fk+".content", "not for kind storage: the content is the object's")
		}
		for _, kv := range [][2]string{{"secret", f.Secret}, {"source", f.Source}, {"secret_id", f.SecretID},
			{"version_stage", f.VersionStage}, {"version_id", f.VersionID}, {"parameter", f.Parameter}, {"region", f.Region}} {
			set(kv[0], kv[1])
		}
	default:
		for _, kv := range [][2]string{{"secret", f.Secret}, {"source", f.Source}, {"secret_id", f.SecretID},
			{"version_stage", f.VersionStage}, {"version_id", f.VersionID}, {"parameter", f.Parameter}, {"region", f.Region}} {
			set(kv[0], kv[1])
		}
		if f.Object != "" {
			ch.add(fk+".object", "for kind storage only")
		}
	}
	if f.Template && f.Kind != FileKindStorage {
		ch.add(fk+".template", "for kind storage only (other kinds' content is always rendered)")
	}
}

func checkSecretSource(ch *checker, fk string, f TemplateFile) {
	if f.Mode != "" {
		if m, err := strconv.ParseUint(f.Mode, 8, 32); err == nil && m&^MaxSecretFileMode != 0 {
			ch.add(fk+".mode", "a secret file is readable by its owner only: at most \"0600\", got %q", f.Mode)
		}
	}
	if f.Content != "" {
		ch.add(fk+".content", "not for kind secret: the value comes from its source")
	}
	if f.Object != "" {
		ch.add(fk+".object", "for kind storage only")
	}
	notFor := func(name, v, src string) {
		if v != "" {
			ch.add(fk+"."+name, "not used by source %s", src)
		}
	}
	src := f.SecretSource()
	switch src {
	case FileSourceCluster:
		if f.Secret == "" {
			ch.add(fk+".secret", "required for kind secret with source cluster (the name of a file secret; nstance-admin cluster secret put)")
		} else if err := layout.ValidateID("secret name", f.Secret); err != nil {
			ch.add(fk+".secret", "%v", err)
		}
		for _, kv := range [][2]string{{"secret_id", f.SecretID}, {"version_stage", f.VersionStage}, {"version_id", f.VersionID},
			{"parameter", f.Parameter}, {"region", f.Region}} {
			notFor(kv[0], kv[1], src)
		}
	case FileSourceAWSSecretsManager:
		if f.SecretID == "" {
			ch.add(fk+".secret_id", "required for source aws-secrets-manager")
		}
		if f.VersionStage != "" && f.VersionID != "" {
			ch.add(fk+".version_id", "set only one of version_stage and version_id")
		}
		notFor("secret", f.Secret, src)
		notFor("parameter", f.Parameter, src)
	case FileSourceAWSSSM:
		if f.Parameter == "" {
			ch.add(fk+".parameter", "required for source aws-ssm")
		}
		for _, kv := range [][2]string{{"secret", f.Secret}, {"secret_id", f.SecretID}, {"version_stage", f.VersionStage}, {"version_id", f.VersionID}} {
			notFor(kv[0], kv[1], src)
		}
	case FileSourceGCPSecretManager:
		checkGCPSecret(ch, fk, f.SecretID, f.VersionStage)
		for _, kv := range [][2]string{{"secret", f.Secret}, {"parameter", f.Parameter}, {"region", f.Region}} {
			notFor(kv[0], kv[1], src)
		}
	default:
		ch.add(fk+".source", "must be \"cluster\", \"aws-secrets-manager\", \"aws-ssm\" or \"gcp-secret-manager\", got %q", f.Source)
	}
}
