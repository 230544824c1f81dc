package devs3_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/go-logr/logr/funcr"
	"github.com/stretchr/testify/require"

	"github.com/nstance-dev/nstance/internal/devs3"
	"github.com/nstance-dev/nstance/internal/devs3/devs3test"
	"github.com/nstance-dev/nstance/internal/testing/hosttools"
)

// opLog counts the S3 operations dev-s3 logs at V(1).
type opLog struct {
	mu  sync.Mutex
	ops map[string]int
}

func (l *opLog) record(_, args string) {
	i := strings.Index(args, `"op"="`)
	if i < 0 {
		return
	}
	op := args[i+len(`"op"="`):]
	op = op[:strings.IndexByte(op, '"')]
	l.mu.Lock()
	l.ops[op]++
	l.mu.Unlock()
}

func (l *opLog) count(op string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.ops[op]
}

// awsCLI runs the aws CLI (v1) against endpoint with dev credentials and
// an empty HOME so no user configuration leaks in.
type awsCLI struct {
	t        *testing.T
	bin      string
	env      []string
	endpoint string
	workdir  string
}

func newAWSCLI(t *testing.T, endpoint string) *awsCLI {
	bin := hosttools.Require(t, "aws")
	home := t.TempDir()
	env := []string{
		"PATH=" + os.Getenv("PATH"),
		"HOME=" + home,
		"AWS_CONFIG_FILE=" + filepath.Join(home, "config"),
		"AWS_SHARED_CREDENTIALS_FILE=" + filepath.Join(home, "credentials"),
		"AWS_ACCESS_KEY_ID=dev",
		"AWS_SECRET_ACCESS_KEY=dev",
		"AWS_DEFAULT_REGION=us-east-1",
		"AWS_PAGER=",
	}
	// A pyenv shim finds its root through HOME, which is now empty: pass it on.
	pyenvRoot := os.Getenv("PYENV_ROOT")
	if pyenvRoot == "" {
		if h, err := os.UserHomeDir(); err == nil {
			if st, err := os.Stat(filepath.Join(h, ".pyenv")); err == nil && st.IsDir() {
				pyenvRoot = filepath.Join(h, ".pyenv")
			}
		}
	}
	if pyenvRoot != "" {
		env = append(env, "PYENV_ROOT="+pyenvRoot)
	}
	if v := os.Getenv("PYENV_VERSION"); v != "" {
		env = append(env, "PYENV_VERSION="+v)
	}
	return &awsCLI{t: t, bin: bin, env: env, endpoint: endpoint, workdir: t.TempDir()}
}

// withCredentials returns a copy of a that signs with another key pair.
func (a *awsCLI) withCredentials(accessKey, secretKey string) *awsCLI {
	b := *a
	b.env = nil
	for _, e := range a.env {
		switch {
		case strings.HasPrefix(e, "AWS_ACCESS_KEY_ID="):
			e = "AWS_ACCESS_KEY_ID=" + accessKey
		case strings.HasPrefix(e, "AWS_SECRET_ACCESS_KEY="):
			e = "AWS_SECRET_ACCESS_KEY=" + secretKey
		}
		b.env = append(b.env, e)
	}
	return &b
}

// home is the CLI's HOME (its config file lives there).
func (a *awsCLI) home() string {
	for _, e := range a.env {
		if h, ok := strings.CutPrefix(e, "HOME="); ok {
			return h
		}
	}
	return ""
}

func (a *awsCLI) run(args ...string) (string, string, error) {
	args = append(args, "--endpoint-url", a.endpoint)
	cmd := exec.CommandContext(context.Background(), a.bin, args...)
	cmd.Env = a.env
	cmd.Dir = a.workdir
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	return stdout.String(), stderr.String(), err
}

func (a *awsCLI) ok(args ...string) string {
	a.t.Helper()
	out, errOut, err := a.run(args...)
	require.NoError(a.t, err, "aws %s\nstdout: %s\nstderr: %s", strings.Join(args, " "), out, errOut)
	return out
}

// TestAWSCLI runs the same scenario against dev-s3 accepting any
// credentials and against dev-s3 checking signatures.
func TestAWSCLI(t *testing.T) {
	t.Run("any credentials", func(t *testing.T) { awsCLIScenario(t, false) })
	t.Run("signatures checked", func(t *testing.T) { awsCLIScenario(t, true) })
}

func awsCLIScenario(t *testing.T, signed bool) {
	dir := t.TempDir()
	ops := &opLog{ops: map[string]int{}}
	cfg := devs3.Config{Dir: dir, Log: funcr.New(ops.record, funcr.Options{Verbosity: 1})}
	if signed {
		cfg.AccessKey, cfg.SecretKey = testAK, testSK
	}
	srv := devs3test.StartWith(t, cfg)
	cli := newAWSCLI(t, srv.URL)
	if signed {
		cli = cli.withCredentials(testAK, testSK)
		for _, bad := range []struct{ ak, sk, code string }{{testAK, "wrong", "SignatureDoesNotMatch"}, {"nobody", testSK, "InvalidAccessKeyId"}} {
			_, errOut, err := cli.withCredentials(bad.ak, bad.sk).run("s3", "ls", "s3://dev/")
			require.Error(t, err)
			require.Contains(t, errOut, bad.code)
		}
	}
	work := t.TempDir()
	write := func(name string, data []byte) string {
		p := filepath.Join(work, name)
		require.NoError(t, os.MkdirAll(filepath.Dir(p), 0o755))
		require.NoError(t, os.WriteFile(p, data, 0o644))
		return p
	}

	// Small upload: a plain file on disk.
	small := write("small.txt", []byte("hello dev-s3\n"))
	cli.ok("s3", "cp", small, "s3://dev/cli/small.txt")
	data, err := os.ReadFile(filepath.Join(dir, "cli", "small.txt"))
	require.NoError(t, err)
	require.Equal(t, "hello dev-s3\n", string(data))

	// 20 MiB upload goes multipart; download (ranged GETs) matches.
	big := make([]byte, 20<<20)
	_, err = rand.Read(big)
	require.NoError(t, err)
	bigPath := write("big.bin", big)
	cli.ok("s3", "cp", bigPath, "s3://dev/cli/big.bin")
	require.Equal(t, 1, ops.count("CreateMultipartUpload"), "the 20 MiB upload must use multipart")
	require.GreaterOrEqual(t, ops.count("UploadPart"), 2)
	require.Equal(t, 1, ops.count("CompleteMultipartUpload"))
	onDisk, err := os.ReadFile(filepath.Join(dir, "cli", "big.bin"))
	require.NoError(t, err)
	require.True(t, bytes.Equal(big, onDisk))
	down := filepath.Join(work, "down.bin")
	cli.ok("s3", "cp", "s3://dev/cli/big.bin", down)
	got, err := os.ReadFile(down)
	require.NoError(t, err)
	require.True(t, bytes.Equal(big, got), "downloaded body differs")

	// head-object reports the MD5 ETag of the whole body.
	var head struct {
		ETag          string
		ContentLength int64
	}
	require.NoError(t, json.Unmarshal([]byte(cli.ok("s3api", "head-object", "--bucket", "dev", "--key", "cli/big.bin")), &head))
	require.Equal(t, `"`+md5hex(big)+`"`, head.ETag)
	require.Equal(t, int64(len(big)), head.ContentLength)

	// ls, plain and recursive.
	out := cli.ok("s3", "ls", "s3://dev/cli/")
	require.Contains(t, out, "small.txt")
	require.Contains(t, out, "big.bin")
	out = cli.ok("s3", "ls", "s3://dev/")
	require.Contains(t, out, "PRE cli/")

	// sync up, change one file, sync again: only that file is sent.
	write("tree/a.txt", []byte("a"))
	write("tree/sub/b.txt", []byte("b"))
	write("tree/sub/deeper/c.txt", []byte("c"))
	cli.ok("s3", "sync", filepath.Join(work, "tree"), "s3://dev/synced/")
	for _, k := range []string{"a.txt", "sub/b.txt", "sub/deeper/c.txt"} {
		require.FileExists(t, filepath.Join(dir, "synced", filepath.FromSlash(k)))
	}
	puts := ops.count("PutObject")
	write("tree/sub/b.txt", []byte("b changed"))
	out = cli.ok("s3", "sync", filepath.Join(work, "tree"), "s3://dev/synced/")
	require.Contains(t, out, "sub/b.txt")
	require.Equal(t, puts+1, ops.count("PutObject"), "sync sends only the changed file")
	back := filepath.Join(work, "back")
	cli.ok("s3", "sync", "s3://dev/synced/", back)
	got, err = os.ReadFile(filepath.Join(back, "sub", "b.txt"))
	require.NoError(t, err)
	require.Equal(t, "b changed", string(got))

	// rm, single and recursive.
	cli.ok("s3", "rm", "s3://dev/cli/small.txt")
	require.NoFileExists(t, filepath.Join(dir, "cli", "small.txt"))
	cli.ok("s3", "rm", "--recursive", "s3://dev/synced/")
	require.NoDirExists(t, filepath.Join(dir, "synced"))

	// put-object --if-none-match '*': the second one fails with 412.
	// Older CLIs (Debian 12's aws-cli 2.9) have no --if-none-match; there the
	// object is put plainly and the conditional PUT is left to the SDK
	// contract suites, which cover it on every backend.
	once := write("once.txt", []byte("first"))
	out, errOut, err := cli.run("s3api", "put-object", "--bucket", "dev", "--key", "cli/once", "--body", once, "--if-none-match", "*")
	if err != nil && strings.Contains(errOut, "Unknown options: --if-none-match") {
		version, _, _ := cli.run("--version")
		t.Logf("%s has no put-object --if-none-match; conditional PUTs are checked by the SDK contract suites", strings.TrimSpace(version))
		cli.ok("s3api", "put-object", "--bucket", "dev", "--key", "cli/once", "--body", once)
	} else {
		require.NoError(t, err, "put-object --if-none-match\nstdout: %s\nstderr: %s", out, errOut)
		write("once.txt", []byte("second"))
		_, errOut, err = cli.run("s3api", "put-object", "--bucket", "dev", "--key", "cli/once", "--body", once, "--if-none-match", "*")
		require.Error(t, err)
		require.Contains(t, errOut, "PreconditionFailed")
	}
	data, err = os.ReadFile(filepath.Join(dir, "cli", "once"))
	require.NoError(t, err)
	require.Equal(t, "first", string(data))

	// aws s3 presign: the URL works without credentials, a changed one does
	// not. aws CLI v1 presigns with Signature Version 2 unless configured
	// for s3v4 (v2 uses version 4 by default); dev-s3 checks only version 4
	// and says so.
	if signed {
		dflt := strings.TrimSpace(cli.ok("s3", "presign", "s3://dev/cli/once"))
		res, err := http.Get(dflt)
		require.NoError(t, err)
		body, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if strings.Contains(dflt, "X-Amz-Algorithm=AWS4-HMAC-SHA256") {
			require.Equal(t, http.StatusOK, res.StatusCode, "a version 4 presigned URL works: %s", body)
		} else {
			require.Contains(t, dflt, "AWSAccessKeyId=", "a presigned URL is either version 4 or version 2")
			require.Equal(t, http.StatusBadRequest, res.StatusCode)
			require.Contains(t, string(body), "AWS4-HMAC-SHA256")
		}
	}
	require.NoError(t, os.WriteFile(filepath.Join(cli.home(), "config"), []byte("[default]\ns3 =\n    signature_version = s3v4\n"), 0o600))
	url := strings.TrimSpace(cli.ok("s3", "presign", "s3://dev/cli/once", "--expires-in", "300"))
	res, err := http.Get(url)
	require.NoError(t, err)
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	require.Equal(t, http.StatusOK, res.StatusCode, "%s", body)
	require.Equal(t, "first", string(body))
	res, err = http.Get(strings.Replace(url, "cli/once", "cli/big.bin", 1))
	require.NoError(t, err)
	res.Body.Close()
	if signed {
		require.Equal(t, http.StatusForbidden, res.StatusCode)
	} else {
		require.Equal(t, http.StatusOK, res.StatusCode, "without --access-key anything goes")
	}
}
