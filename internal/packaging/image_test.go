package packaging_test

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"crypto/x509"
	"debug/buildinfo"
	"encoding/hex"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

const imageVersion = "v9.9.9-test"

// readTar returns every regular file of a tar stream by name.
func readTar(t *testing.T, r io.Reader) (map[string][]byte, map[string]*tar.Header) {
	t.Helper()
	files, headers := map[string][]byte{}, map[string]*tar.Header{}
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		require.NoError(t, err)
		headers[strings.TrimPrefix(h.Name, "./")] = h
		if h.Typeflag == tar.TypeReg {
			data, err := io.ReadAll(tr)
			require.NoError(t, err)
			files[strings.TrimPrefix(h.Name, "./")] = data
		}
	}
	return files, headers
}

type descriptor struct {
	MediaType   string            `json:"mediaType"`
	Digest      string            `json:"digest"`
	Size        int64             `json:"size"`
	Annotations map[string]string `json:"annotations"`
}

// blob returns a blob of the archive after checking its digest and size.
func blob(t *testing.T, files map[string][]byte, d descriptor) []byte {
	t.Helper()
	hexDigest, ok := strings.CutPrefix(d.Digest, "sha256:")
	require.True(t, ok, "digest %s", d.Digest)
	data, ok := files["blobs/sha256/"+hexDigest]
	require.True(t, ok, "blob %s missing", d.Digest)
	sum := sha256.Sum256(data)
	require.Equal(t, hexDigest, hex.EncodeToString(sum[:]), "blob content does not match its digest")
	require.EqualValues(t, d.Size, len(data))
	return data
}

// TestOperatorImageArchive builds the operator image the way `make
// image-operator` does, twice, and checks the archive from the outside with
// the standard library only.
func TestOperatorImageArchive(t *testing.T) {
	require.True(t, operatorExists(), "cmd/nstance-operator has no main package")
	help := checkImageArchive(t, "nstance-operator", "image-operator")

	// Every flag the chart passes is one the binary knows.
	for _, r := range renderings() {
		_, c := deployment(t, render(t, r))
		for _, arg := range c.Args {
			flag := regexp.MustCompile(`^--?([a-z0-9-]+)`).FindStringSubmatch(arg)
			require.NotNil(t, flag, "argument %q", arg)
			require.Regexp(t, `(?m)^\s+--?`+regexp.QuoteMeta(flag[1])+`\b`, help, "the chart passes %s, which the operator does not accept", arg)
		}
	}
}

// TestServerImageArchive builds the nstance-server image (`make
// image-server`) twice and checks it like the operator's; the flags and
// environment variables the server chart passes must be ones the binary
// knows.
func TestServerImageArchive(t *testing.T) {
	help := checkImageArchive(t, "nstance-server", "image-server")
	for _, r := range serverRenderings() {
		objs := r.render(t)
		for _, d := range ofKind(objs, "Deployment") {
			_, c := serverDeployment(t, d)
			for _, arg := range c.Args {
				flag := regexp.MustCompile(`^--?([a-z0-9-]+)`).FindStringSubmatch(arg)
				require.NotNil(t, flag, "argument %q", arg)
				require.Regexp(t, `(?m)^\s+--?`+regexp.QuoteMeta(flag[1])+`\b`, help, "the chart passes %s, which nstance-server does not accept", arg)
			}
		}
		for _, name := range serverEnvNames(t, objs) {
			if strings.HasPrefix(name, "NSTANCE_") && name != "NSTANCE_ENCRYPTION_KEY" {
				require.Contains(t, help, "$"+name, "the chart sets %s, which no nstance-server flag reads", name)
			}
		}
	}
}

// checkImageArchive builds the image of name with `make target`, twice, and
// checks the archive from the outside with the standard library only. It
// returns the binary's --help output.
func checkImageArchive(t *testing.T, name, target string) string {
	t.Helper()
	var archives [2][]byte
	for i := range archives {
		dist := t.TempDir()
		run(t, root, "make", "-s", target, "DIST="+dist, "VERSION="+imageVersion, "IMAGE_ARCH="+runtime.GOARCH)
		path := filepath.Join(dist, "images", name+"-"+imageVersion+"-linux-"+runtime.GOARCH+".tar")
		data, err := os.ReadFile(path)
		require.NoError(t, err)
		archives[i] = data
	}
	require.True(t, bytes.Equal(archives[0], archives[1]), "two builds of the same inputs differ")
	sum0, sum1 := sha256.Sum256(archives[0]), sha256.Sum256(archives[1])
	t.Logf("%s archive: %d bytes, sha256 %x (both builds: %x)", name, len(archives[0]), sum0, sum1)

	files, _ := readTar(t, bytes.NewReader(archives[0]))
	require.JSONEq(t, `{"imageLayoutVersion":"1.0.0"}`, string(files["oci-layout"]))

	// OCI layout: index -> manifest -> config and layer.
	var index struct {
		Manifests []descriptor `json:"manifests"`
	}
	require.NoError(t, json.Unmarshal(files["index.json"], &index))
	require.Len(t, index.Manifests, 1)
	ref := "ghcr.io/nstance-dev/" + name + ":" + imageVersion
	require.Equal(t, ref, index.Manifests[0].Annotations["io.containerd.image.name"])
	require.Equal(t, "application/vnd.oci.image.manifest.v1+json", index.Manifests[0].MediaType)
	var manifest struct {
		Config descriptor   `json:"config"`
		Layers []descriptor `json:"layers"`
	}
	require.NoError(t, json.Unmarshal(blob(t, files, index.Manifests[0]), &manifest))
	require.Len(t, manifest.Layers, 1)

	// Docker `load` manifest over the same blobs.
	var docker []struct {
		Config   string
		RepoTags []string
		Layers   []string
	}
	require.NoError(t, json.Unmarshal(files["manifest.json"], &docker))
	require.Len(t, docker, 1)
	path := func(d descriptor) string { return "blobs/sha256/" + strings.TrimPrefix(d.Digest, "sha256:") }
	require.Equal(t, path(manifest.Config), docker[0].Config)
	require.Equal(t, []string{path(manifest.Layers[0])}, docker[0].Layers)
	require.Equal(t, []string{ref}, docker[0].RepoTags)

	var cfg struct {
		OS           string `json:"os"`
		Architecture string `json:"architecture"`
		Config       struct {
			User       string            `json:"User"`
			Env        []string          `json:"Env"`
			Entrypoint []string          `json:"Entrypoint"`
			Cmd        []string          `json:"Cmd"`
			Labels     map[string]string `json:"Labels"`
		} `json:"config"`
		RootFS struct {
			DiffIDs []string `json:"diff_ids"`
		} `json:"rootfs"`
	}
	require.NoError(t, json.Unmarshal(blob(t, files, manifest.Config), &cfg))
	require.Equal(t, "linux", cfg.OS)
	require.Equal(t, runtime.GOARCH, cfg.Architecture)
	require.Equal(t, "65532:65532", cfg.Config.User)
	require.Contains(t, cfg.Config.Env, "NSTANCE_LOG_FORMAT=json", "production images log JSON")
	require.Equal(t, []string{"/usr/local/bin/" + name}, cfg.Config.Entrypoint)
	require.Empty(t, cfg.Config.Cmd)
	require.Equal(t, imageVersion, cfg.Config.Labels["org.opencontainers.image.version"])
	require.Equal(t, "https://github.com/nstance-dev/nstance", cfg.Config.Labels["org.opencontainers.image.source"])
	require.Equal(t, "Apache-2.0", cfg.Config.Labels["org.opencontainers.image.licenses"])

	// The layer: gzip of a tar whose digest is the config's diff_id.
	gz, err := gzip.NewReader(bytes.NewReader(blob(t, files, manifest.Layers[0])))
	require.NoError(t, err)
	layerTar, err := io.ReadAll(gz)
	require.NoError(t, err)
	sum := sha256.Sum256(layerTar)
	require.Equal(t, []string{"sha256:" + hex.EncodeToString(sum[:])}, cfg.RootFS.DiffIDs)
	rootfs, headers := readTar(t, bytes.NewReader(layerTar))
	require.Contains(t, string(rootfs["etc/passwd"]), "nonroot:x:65532:65532:")
	require.Contains(t, string(rootfs["etc/group"]), "nonroot:x:65532:")
	pool := x509.NewCertPool()
	require.True(t, pool.AppendCertsFromPEM(rootfs["etc/ssl/certs/ca-certificates.crt"]), "no CA certificates in the image")
	binPath := "usr/local/bin/" + name
	require.EqualValues(t, 0o755, headers[binPath].Mode&0o777)
	require.EqualValues(t, 0o1777, headers["tmp/"].Mode&0o7777, "/tmp must be world-writable and sticky")

	// The binary: static, CGO-free, version stamped, and it runs.
	bin := filepath.Join(t.TempDir(), name)
	require.NoError(t, os.WriteFile(bin, rootfs[binPath], 0o755))
	info, err := buildinfo.ReadFile(bin)
	require.NoError(t, err)
	settings := map[string]string{}
	for _, s := range info.Settings {
		settings[s.Key] = s.Value
	}
	require.Equal(t, "0", settings["CGO_ENABLED"])
	require.Equal(t, "linux", settings["GOOS"])
	// -trimpath keeps -ldflags out of the build info; the stamped string is
	// in the data section, provided the program links internal/version at
	// all (the linker drops -X for packages it does not link).
	if linksVersion(t, name) {
		require.True(t, bytes.Contains(rootfs[binPath], []byte(imageVersion)), "version %s not stamped", imageVersion)
	} else {
		t.Logf("%s does not import internal/version; only the image label carries the version", name)
	}
	out, err := exec.Command(bin, "--help").CombinedOutput()
	require.NoError(t, err, "%s --help:\n%s", name, out)
	return string(out)
}

// linksVersion reports whether ./cmd/<name> depends on internal/version.
func linksVersion(t *testing.T, name string) bool {
	t.Helper()
	deps := run(t, root, "go", "list", "-deps", "./cmd/"+name)
	return slices.Contains(strings.Fields(deps), "github.com/nstance-dev/nstance/internal/version")
}

// TestImageTargets: every `make image-*` target builds its program static,
// with the version stamped (scripts/image is the one build path; there are
// no Containerfiles to drift from it).
func TestImageTargets(t *testing.T) {
	for _, name := range []string{"nstance-operator", "nstance-server", "nstance-agent", "nstance-admin"} {
		short := strings.TrimPrefix(name, "nstance-")
		plan := run(t, root, "make", "-n", "image-"+short, "VERSION="+imageVersion)
		require.Contains(t, plan, "CGO_ENABLED=0")
		require.Contains(t, plan, "./cmd/"+name)
		require.Contains(t, plan, "internal/version.Version="+imageVersion)
		require.Contains(t, plan, "scripts/image")
	}
}

// TestMultiPlatformImage: scripts/image -platforms writes one OCI layout whose
// index.json names an image index of a linux/amd64 and a linux/arm64 image,
// each labelled with the version, source and license; two builds of the same
// inputs are byte-identical. The binaries are stand-ins (the images are
// inspected, not run); TestOperatorImageArchive runs a real one.
func TestMultiPlatformImage(t *testing.T) {
	bins := t.TempDir()
	for _, arch := range []string{"amd64", "arm64"} {
		require.NoError(t, os.WriteFile(filepath.Join(bins, arch), []byte("binary for "+arch), 0o755))
	}
	var archives [2][]byte
	for i := range archives {
		out := filepath.Join(t.TempDir(), "nstance-agent.oci.tar")
		run(t, filepath.Join(root, "scripts", "image"), "go", "run", ".", "-name", "nstance-agent", "-version", imageVersion,
			"-platforms", "amd64="+filepath.Join(bins, "amd64")+",arm64="+filepath.Join(bins, "arm64"), "-out", out)
		data, err := os.ReadFile(out)
		require.NoError(t, err)
		archives[i] = data
	}
	require.True(t, bytes.Equal(archives[0], archives[1]), "two builds of the same inputs differ")

	files, _ := readTar(t, bytes.NewReader(archives[0]))
	require.NotContains(t, files, "manifest.json", "a multi-platform archive is for pushing, not docker load")
	var top struct {
		Manifests []descriptor `json:"manifests"`
	}
	require.NoError(t, json.Unmarshal(files["index.json"], &top))
	require.Len(t, top.Manifests, 1)
	require.Equal(t, "application/vnd.oci.image.index.v1+json", top.Manifests[0].MediaType)
	require.Equal(t, "ghcr.io/nstance-dev/nstance-agent:"+imageVersion, top.Manifests[0].Annotations["io.containerd.image.name"])
	var index struct {
		Manifests []struct {
			descriptor
			Platform struct {
				OS           string `json:"os"`
				Architecture string `json:"architecture"`
			} `json:"platform"`
		} `json:"manifests"`
	}
	require.NoError(t, json.Unmarshal(blob(t, files, top.Manifests[0]), &index))
	require.Len(t, index.Manifests, 2)
	for i, arch := range []string{"amd64", "arm64"} {
		m := index.Manifests[i]
		require.Equal(t, "linux", m.Platform.OS)
		require.Equal(t, arch, m.Platform.Architecture)
		var manifest struct {
			Config descriptor   `json:"config"`
			Layers []descriptor `json:"layers"`
		}
		require.NoError(t, json.Unmarshal(blob(t, files, m.descriptor), &manifest))
		var cfg struct {
			Architecture string `json:"architecture"`
			Config       struct {
				Labels map[string]string `json:"Labels"`
			} `json:"config"`
		}
		require.NoError(t, json.Unmarshal(blob(t, files, manifest.Config), &cfg))
		require.Equal(t, arch, cfg.Architecture)
		require.Equal(t, imageVersion, cfg.Config.Labels["org.opencontainers.image.version"])
		require.Equal(t, "https://github.com/nstance-dev/nstance", cfg.Config.Labels["org.opencontainers.image.source"])
		require.Equal(t, "Apache-2.0", cfg.Config.Labels["org.opencontainers.image.licenses"])
		gz, err := gzip.NewReader(bytes.NewReader(blob(t, files, manifest.Layers[0])))
		require.NoError(t, err)
		layer, _ := readTar(t, gz)
		require.Equal(t, "binary for "+arch, string(layer["usr/local/bin/nstance-agent"]))
	}
}
