package proxmox

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/diskfs/go-diskfs/backend/file"
	"github.com/diskfs/go-diskfs/filesystem/iso9660"
)

// SeedLabel is the volume label cloud-init's NoCloud data source looks for.
const SeedLabel = "cidata"

// SeedFiles are the files of a NoCloud seed: user-data and meta-data
// (required), network-config (optional).
type SeedFiles struct {
	UserData, MetaData, NetworkConfig []byte
}

// MetaData is the NoCloud meta-data of an instance: its id (cloud-init
// runs its first-boot modules once per instance id) and host name.
func MetaData(instanceID string) []byte {
	return []byte(fmt.Sprintf("instance-id: %s\nlocal-hostname: %s\n", instanceID, instanceID))
}

// BuildSeedISO returns an ISO 9660 image (Rock Ridge and Joliet names)
// labelled cidata holding f: what cloud-init's NoCloud data source reads
// from a CD-ROM. The files pass through a private temporary directory
// (mode 0700, removed before returning) because the ISO writer works on
// files.
func BuildSeedISO(f SeedFiles) (_ []byte, err error) {
	if len(f.UserData) == 0 || len(f.MetaData) == 0 {
		return nil, errors.New("seed ISO: user-data and meta-data are required")
	}
	dir, err := os.MkdirTemp("", "nstance-seed-")
	if err != nil {
		return nil, fmt.Errorf("seed ISO: %w", err)
	}
	defer func() { _ = os.RemoveAll(dir) }()
	work := filepath.Join(dir, "work")
	if err := os.Mkdir(work, 0o700); err != nil {
		return nil, fmt.Errorf("seed ISO: %w", err)
	}
	img := filepath.Join(dir, "seed.iso")
	if err := os.WriteFile(img, nil, 0o600); err != nil {
		return nil, fmt.Errorf("seed ISO: %w", err)
	}
	b, err := file.OpenFromPath(img, false)
	if err != nil {
		return nil, fmt.Errorf("seed ISO: %w", err)
	}
	defer func() {
		if cerr := b.Close(); cerr != nil && err == nil {
			err = fmt.Errorf("seed ISO: %w", cerr)
		}
	}()
	fsys, err := iso9660.Create(b, 0, 0, 2048, work)
	if err != nil {
		return nil, fmt.Errorf("seed ISO: %w", err)
	}
	files := map[string][]byte{"user-data": f.UserData, "meta-data": f.MetaData}
	if len(f.NetworkConfig) > 0 {
		files["network-config"] = f.NetworkConfig
	}
	names := make([]string, 0, len(files))
	for n := range files {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		w, err := fsys.OpenFile("/"+n, os.O_CREATE|os.O_RDWR)
		if err != nil {
			return nil, fmt.Errorf("seed ISO: %s: %w", n, err)
		}
		if _, err := w.Write(files[n]); err != nil {
			_ = w.Close()
			return nil, fmt.Errorf("seed ISO: %s: %w", n, err)
		}
		if err := w.Close(); err != nil {
			return nil, fmt.Errorf("seed ISO: %s: %w", n, err)
		}
	}
	if err := fsys.Finalize(iso9660.FinalizeOptions{RockRidge: true, Joliet: true, VolumeIdentifier: SeedLabel}); err != nil {
		return nil, fmt.Errorf("seed ISO: %w", err)
	}
	out, err := os.ReadFile(img)
	if err != nil {
		return nil, fmt.Errorf("seed ISO: %w", err)
	}
	return out, nil
}

// ReadSeedISO returns the files of a seed ISO and its volume label (tests
// and the fake read back what was uploaded).
func ReadSeedISO(img []byte) (label string, files map[string][]byte, err error) {
	dir, err := os.MkdirTemp("", "nstance-seed-read-")
	if err != nil {
		return "", nil, err
	}
	defer func() { _ = os.RemoveAll(dir) }()
	p := filepath.Join(dir, "seed.iso")
	if err := os.WriteFile(p, img, 0o600); err != nil {
		return "", nil, err
	}
	b, err := file.OpenFromPath(p, true)
	if err != nil {
		return "", nil, err
	}
	defer func() { _ = b.Close() }()
	fsys, err := iso9660.Read(b, int64(len(img)), 0, 2048)
	if err != nil {
		return "", nil, fmt.Errorf("reading seed ISO: %w", err)
	}
	entries, err := fsys.ReadDir(".")
	if err != nil {
		return "", nil, fmt.Errorf("reading seed ISO: %w", err)
	}
	files = map[string][]byte{}
	for _, e := range entries {
		data, err := fsys.ReadFile(e.Name())
		if err != nil {
			return "", nil, fmt.Errorf("reading seed ISO %s: %w", e.Name(), err)
		}
		files[e.Name()] = data
	}
	return strings.TrimRight(fsys.Label(), " \x00"), files, nil
}
