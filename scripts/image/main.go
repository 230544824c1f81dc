// Command image assembles a minimal container image around one static Nstance
// binary and writes it as a single tar archive, with no container daemon.
//
// The archive is an OCI image layout (oci-layout, index.json, blobs/sha256/...)
// that also carries a Docker-style manifest.json pointing at the same blobs, so
// both `docker load` and `podman load` accept it, as do OCI tools reading the
// layout.
//
// The image has one layer on an empty base:
//
//	/usr/local/bin/<name>                the binary (the entrypoint)
//	/etc/ssl/certs/ca-certificates.crt   the build host's CA bundle
//	/etc/passwd, /etc/group              root and nonroot (65532)
//	/home/nonroot, /tmp                  writable directories
//
// and runs as 65532:65532. Every timestamp is SOURCE_DATE_EPOCH (or the Unix
// epoch), so the same inputs give the same digests.
//
// With -platforms (amd64=PATH,arm64=PATH) it writes one multi-platform image
// instead: an OCI layout whose index.json names an image index of one image
// per architecture, for pushing (`skopeo copy --all oci-archive:OUT
// docker://REPO/NAME:TAG`); such an archive has no Docker manifest.json.
package main

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// NonRootID is the uid and gid the image runs as.
const NonRootID = 65532

type options struct {
	binary   string
	name     string
	version  string
	arch     string
	repo     string
	source   string
	caBundle string
	out      string
	// platforms maps GOARCH to binary path for a multi-platform index.
	platforms string
}

func main() {
	var o options
	flag.StringVar(&o.binary, "binary", "", "path of the static linux binary to package (required)")
	flag.StringVar(&o.name, "name", "", "binary name inside the image; default: base name of -binary")
	flag.StringVar(&o.version, "version", "dev", "version for the tag and the org.opencontainers.image.version label")
	flag.StringVar(&o.arch, "arch", "amd64", "GOARCH of the binary (amd64, arm64)")
	flag.StringVar(&o.repo, "repo", "ghcr.io/nstance-dev", "repository prefix; the image is <repo>/<name>:<version>")
	flag.StringVar(&o.source, "source", "https://github.com/nstance-dev/nstance", "org.opencontainers.image.source label")
	flag.StringVar(&o.caBundle, "ca-bundle", "/etc/ssl/certs/ca-certificates.crt", "CA bundle copied into the image")
	flag.StringVar(&o.out, "out", "", "output archive path (required)")
	flag.StringVar(&o.platforms, "platforms", "", "multi-platform image: comma-separated GOARCH=binary pairs (instead of -binary and -arch)")
	flag.Parse()
	if err := run(o); err != nil {
		fmt.Fprintln(os.Stderr, "image:", err)
		os.Exit(1)
	}
}

func run(o options) error {
	if o.platforms != "" {
		return runIndex(o)
	}
	if o.binary == "" || o.out == "" {
		return errors.New("-binary and -out are required")
	}
	if o.name == "" {
		o.name = filepath.Base(o.binary)
	}
	if o.arch != "amd64" && o.arch != "arm64" {
		return fmt.Errorf("unsupported -arch %q (amd64, arm64)", o.arch)
	}
	created, err := sourceDateEpoch()
	if err != nil {
		return err
	}
	ca, err := os.ReadFile(o.caBundle)
	if err != nil {
		return fmt.Errorf("read CA bundle: %w", err)
	}
	img, err := platformImage(o, o.arch, o.binary, ca, created)
	if err != nil {
		return err
	}
	ref := fmt.Sprintf("%s/%s:%s", strings.TrimSuffix(o.repo, "/"), o.name, tagSafe(o.version))
	return writeArchive(img, ref, o.out, created)
}

// runIndex builds one image per -platforms entry and writes them as one
// multi-platform image index.
func runIndex(o options) error {
	if o.binary != "" || o.name == "" || o.out == "" {
		return errors.New("-platforms needs -name and -out, and no -binary")
	}
	created, err := sourceDateEpoch()
	if err != nil {
		return err
	}
	ca, err := os.ReadFile(o.caBundle)
	if err != nil {
		return fmt.Errorf("read CA bundle: %w", err)
	}
	var idx v1.ImageIndex = mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
	seen := map[string]bool{}
	for _, pair := range strings.Split(o.platforms, ",") {
		arch, path, ok := strings.Cut(pair, "=")
		if !ok || path == "" {
			return fmt.Errorf("-platforms entry %q: want GOARCH=binary", pair)
		}
		if arch != "amd64" && arch != "arm64" {
			return fmt.Errorf("-platforms entry %q: unsupported architecture (amd64, arm64)", pair)
		}
		if seen[arch] {
			return fmt.Errorf("-platforms: %s given twice", arch)
		}
		seen[arch] = true
		img, err := platformImage(o, arch, path, ca, created)
		if err != nil {
			return err
		}
		idx = mutate.AppendManifests(idx, mutate.IndexAddendum{
			Add:        img,
			Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: arch}},
		})
	}
	ref := fmt.Sprintf("%s/%s:%s", strings.TrimSuffix(o.repo, "/"), o.name, tagSafe(o.version))
	dir, err := os.MkdirTemp("", "nstance-image-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	lp, err := layout.Write(dir, empty.Index)
	if err != nil {
		return fmt.Errorf("oci layout: %w", err)
	}
	if err := lp.AppendIndex(idx, layout.WithAnnotations(map[string]string{
		"org.opencontainers.image.ref.name": tagSafe(o.version),
		"io.containerd.image.name":          ref,
	})); err != nil {
		return fmt.Errorf("write index to layout: %w", err)
	}
	if err := dropArtifactType(filepath.Join(dir, "index.json")); err != nil {
		return err
	}
	return tarDir(dir, o.out, created)
}

// platformImage is the image of the linux/arch binary at path.
func platformImage(o options, arch, path string, ca []byte, created time.Time) (v1.Image, error) {
	bin, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read binary for %s: %w", arch, err)
	}
	layerTar, err := rootfs(o.name, bin, ca, created)
	if err != nil {
		return nil, err
	}
	o.arch = arch
	return buildImage(o, layerTar, created)
}

// sourceDateEpoch honours the reproducible-builds convention.
func sourceDateEpoch() (time.Time, error) {
	raw := os.Getenv("SOURCE_DATE_EPOCH")
	if raw == "" {
		return time.Unix(0, 0).UTC(), nil
	}
	sec, err := strconv.ParseInt(raw, 10, 64)
	if err != nil {
		return time.Time{}, fmt.Errorf("SOURCE_DATE_EPOCH %q: %w", raw, err)
	}
	return time.Unix(sec, 0).UTC(), nil
}

// tagSafe maps a version (git describe output) onto the tag alphabet.
func tagSafe(v string) string {
	b := []byte(v)
	for i, c := range b {
		ok := c == '.' || c == '-' || c == '_' || (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')
		if !ok {
			b[i] = '-'
		}
	}
	if len(b) == 0 {
		return "dev"
	}
	return string(b)
}

type entry struct {
	name string
	mode int64
	uid  int
	data []byte
	dir  bool
}

// rootfs returns the single layer as an uncompressed tar.
func rootfs(name string, bin, ca []byte, mtime time.Time) ([]byte, error) {
	passwd := "root:x:0:0:root:/root:/sbin/nologin\n" +
		fmt.Sprintf("nonroot:x:%d:%d:nonroot:/home/nonroot:/sbin/nologin\n", NonRootID, NonRootID)
	group := "root:x:0:\n" + fmt.Sprintf("nonroot:x:%d:\n", NonRootID)
	entries := []entry{
		{name: "etc/", mode: 0o755, dir: true},
		{name: "etc/group", mode: 0o644, data: []byte(group)},
		{name: "etc/passwd", mode: 0o644, data: []byte(passwd)},
		{name: "etc/ssl/", mode: 0o755, dir: true},
		{name: "etc/ssl/certs/", mode: 0o755, dir: true},
		{name: "etc/ssl/certs/ca-certificates.crt", mode: 0o644, data: ca},
		{name: "home/", mode: 0o755, dir: true},
		{name: "home/nonroot/", mode: 0o700, uid: NonRootID, dir: true},
		{name: "tmp/", mode: 0o1777, dir: true},
		{name: "usr/", mode: 0o755, dir: true},
		{name: "usr/local/", mode: 0o755, dir: true},
		{name: "usr/local/bin/", mode: 0o755, dir: true},
		{name: "usr/local/bin/" + name, mode: 0o755, data: bin},
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		h := &tar.Header{
			Name:    e.name,
			Mode:    e.mode,
			Uid:     e.uid,
			Gid:     e.uid,
			ModTime: mtime,
			Format:  tar.FormatPAX,
		}
		if e.dir {
			h.Typeflag = tar.TypeDir
		} else {
			h.Typeflag = tar.TypeReg
			h.Size = int64(len(e.data))
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, fmt.Errorf("layer header %s: %w", e.name, err)
		}
		if !e.dir {
			if _, err := tw.Write(e.data); err != nil {
				return nil, fmt.Errorf("layer file %s: %w", e.name, err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		return nil, fmt.Errorf("close layer: %w", err)
	}
	return buf.Bytes(), nil
}

func buildImage(o options, layerTar []byte, created time.Time) (v1.Image, error) {
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerTar)), nil
	}, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, fmt.Errorf("layer: %w", err)
	}
	base := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	base = mutate.ConfigMediaType(base, types.OCIConfigJSON)
	img, err := mutate.Append(base, mutate.Addendum{
		Layer:     layer,
		MediaType: types.OCILayer,
		History: v1.History{
			Created:   v1.Time{Time: created},
			CreatedBy: "nstance scripts/image: " + o.name,
			Comment:   "static binary, CA bundle, nonroot user",
		},
	})
	if err != nil {
		return nil, fmt.Errorf("append layer: %w", err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	cf = cf.DeepCopy()
	cf.OS = "linux"
	cf.Architecture = o.arch
	cf.Created = v1.Time{Time: created}
	cf.Config.User = fmt.Sprintf("%d:%d", NonRootID, NonRootID)
	cf.Config.Entrypoint = []string{"/usr/local/bin/" + o.name}
	cf.Config.Cmd = nil
	cf.Config.WorkingDir = "/home/nonroot"
	cf.Config.Env = []string{
		"PATH=/usr/local/bin",
		"HOME=/home/nonroot",
		"SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt",
		// Logs are JSON lines in every image, whatever stderr is.
		"NSTANCE_LOG_FORMAT=json",
	}
	cf.Config.Labels = map[string]string{
		"org.opencontainers.image.title":   o.name,
		"org.opencontainers.image.version": o.version,
		"org.opencontainers.image.source":  o.source,
		"org.opencontainers.image.created": created.Format(time.RFC3339),
		// The license of the whole repository (LICENSE).
		"org.opencontainers.image.licenses": "Apache-2.0",
	}
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		return nil, fmt.Errorf("set config: %w", err)
	}
	return img, nil
}

// dockerManifest is one entry of a `docker save` manifest.json.
type dockerManifest struct {
	Config   string   `json:"Config"`
	RepoTags []string `json:"RepoTags"`
	Layers   []string `json:"Layers"`
}

// writeArchive lays the image out as an OCI layout in a scratch directory,
// adds a Docker manifest.json over the same blobs, and tars it all to out.
func writeArchive(img v1.Image, ref, out string, mtime time.Time) error {
	dir, err := os.MkdirTemp("", "nstance-image-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	lp, err := layout.Write(dir, empty.Index)
	if err != nil {
		return fmt.Errorf("oci layout: %w", err)
	}
	tagOnly := ref[strings.LastIndex(ref, ":")+1:]
	if err := lp.AppendImage(img, layout.WithAnnotations(map[string]string{
		"org.opencontainers.image.ref.name": tagOnly,
		"io.containerd.image.name":          ref,
	})); err != nil {
		return fmt.Errorf("write image to layout: %w", err)
	}
	if err := dropArtifactType(filepath.Join(dir, "index.json")); err != nil {
		return err
	}
	cfgName, err := img.ConfigName()
	if err != nil {
		return err
	}
	layers, err := img.Layers()
	if err != nil {
		return err
	}
	dm := dockerManifest{Config: blobPath(cfgName), RepoTags: []string{ref}}
	for _, l := range layers {
		d, err := l.Digest()
		if err != nil {
			return err
		}
		dm.Layers = append(dm.Layers, blobPath(d))
	}
	data, err := json.Marshal([]dockerManifest{dm})
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "manifest.json"), data, 0o644); err != nil {
		return err
	}
	return tarDir(dir, out, mtime)
}

// dropArtifactType removes the artifactType go-containerregistry records on
// index entries: it belongs to artifacts, and this entry is a plain image.
func dropArtifactType(path string) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	var idx map[string]any
	if err := json.Unmarshal(data, &idx); err != nil {
		return fmt.Errorf("index.json: %w", err)
	}
	if ms, ok := idx["manifests"].([]any); ok {
		for _, m := range ms {
			if desc, ok := m.(map[string]any); ok {
				delete(desc, "artifactType")
			}
		}
	}
	data, err = json.Marshal(idx)
	if err != nil {
		return err
	}
	return os.WriteFile(path, data, 0o644)
}

func blobPath(h v1.Hash) string { return "blobs/" + h.Algorithm + "/" + h.Hex }

// tarDir writes the files under dir, sorted, into an uncompressed tar.
func tarDir(dir, out string, mtime time.Time) error {
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		return err
	}
	tmp := out + ".tmp"
	f, err := os.Create(tmp)
	if err != nil {
		return err
	}
	defer os.Remove(tmp)
	tw := tar.NewWriter(f)
	err = filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || path == dir {
			return err
		}
		rel, err := filepath.Rel(dir, path)
		if err != nil {
			return err
		}
		h := &tar.Header{Name: filepath.ToSlash(rel), ModTime: mtime, Format: tar.FormatPAX}
		if d.IsDir() {
			h.Typeflag, h.Name, h.Mode = tar.TypeDir, h.Name+"/", 0o755
			return tw.WriteHeader(h)
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		h.Typeflag, h.Mode, h.Size = tar.TypeReg, 0o644, int64(len(data))
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		_, err = tw.Write(data)
		return err
	})
	if err != nil {
		f.Close()
		return fmt.Errorf("archive: %w", err)
	}
	if err := tw.Close(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(tmp, out)
}
