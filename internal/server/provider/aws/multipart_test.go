package aws_test

import (
	"bytes"
	"compress/gzip"
	"crypto/rand"
	"encoding/base64"
	"io"
	"mime"
	"mime/multipart"
	"net/mail"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nstance-dev/nstance/internal/server/provider/aws"
)

// parts parses a multi-part user data document as cloud-init's MIME reader
// would and returns each part's type, file name and decoded body.
func parts(t *testing.T, doc []byte) [][3]string {
	t.Helper()
	msg, err := mail.ReadMessage(bytes.NewReader(doc))
	require.NoError(t, err)
	mt, params, err := mime.ParseMediaType(msg.Header.Get("Content-Type"))
	require.NoError(t, err)
	require.Equal(t, "multipart/mixed", mt)
	r := multipart.NewReader(msg.Body, params["boundary"])
	var out [][3]string
	for {
		p, err := r.NextPart()
		if err == io.EOF {
			return out
		}
		require.NoError(t, err)
		body, err := io.ReadAll(p)
		require.NoError(t, err)
		if p.Header.Get("Content-Transfer-Encoding") == "base64" {
			body, err = base64.StdEncoding.DecodeString(strings.ReplaceAll(string(body), "\n", ""))
			require.NoError(t, err)
		}
		ct, _, err := mime.ParseMediaType(p.Header.Get("Content-Type"))
		require.NoError(t, err)
		out = append(out, [3]string{ct, p.FileName(), string(body)})
	}
}

func TestComposeUserData(t *testing.T) {
	root := t.TempDir()
	agent := aws.Agent{StateDir: filepath.Join(root, "agent"), EnvFile: filepath.Join(root, "agent.env"),
		Start: "echo started > '" + filepath.Join(root, "started") + "'"}
	req := request("web-1", "web")
	script, err := aws.UserData(agent, req, nil)
	require.NoError(t, err)

	// No bootstrap data of its own: the agent's script alone.
	ud, err := aws.ComposeUserData(script, req)
	require.NoError(t, err)
	require.Equal(t, script, ud)

	// A kubeadm-style cloud-config travels as its own part, byte for byte,
	// after the agent's script; the agent's script still runs.
	cloudConfig := "#cloud-config\nruncmd:\n  - kubeadm join --token abc.def 10.0.0.1:6443\n# boundary look-alike: --==nstance\n"
	req.UserData, req.UserDataFormat = []byte(cloudConfig), "cloud-config"
	ud, err = aws.ComposeUserData(script, req)
	require.NoError(t, err)
	ps := parts(t, ud)
	require.Len(t, ps, 2)
	require.Equal(t, [3]string{"text/x-shellscript", "00-nstance-agent", string(script)}, ps[0])
	require.Equal(t, [3]string{"text/cloud-config", "10-user-data", cloudConfig}, ps[1])
	cmd := exec.Command("sh", "-c", ps[0][2])
	cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, string(out))
	require.FileExists(t, filepath.Join(root, "started"))
	require.NotContains(t, ps[0][2], "NSTANCE_USER_DATA", "on EC2 cloud-init runs the user's part, not the agent")

	// Binary or boundary-carrying data is base64-encoded and still intact.
	req.UserData = []byte("#!/bin/sh\necho '--==nstance-part-boundary-1==' \xff\n")
	ud, err = aws.ComposeUserData(script, req)
	require.NoError(t, err)
	ps = parts(t, ud)
	require.Equal(t, "text/x-shellscript", ps[1][0])
	require.Equal(t, string(req.UserData), ps[1][2])

	// Large but compressible data is gzip-compressed to fit EC2's limit.
	req.UserData = []byte("#cloud-config\n" + strings.Repeat("write_files: []\n", 1500))
	ud, err = aws.ComposeUserData(script, req)
	require.NoError(t, err)
	require.LessOrEqual(t, len(ud), aws.MaxUserData)
	zr, err := gzip.NewReader(bytes.NewReader(ud))
	require.NoError(t, err)
	plain, err := io.ReadAll(zr)
	require.NoError(t, err)
	require.Equal(t, string(req.UserData), parts(t, plain)[1][2])

	// Incompressible data beyond the limit is refused naming the group.
	noise := make([]byte, 15<<10)
	_, _ = rand.Read(noise)
	req.UserData = append([]byte("#!/bin/sh\n"), noise...)
	_, err = aws.ComposeUserData(script, req)
	require.ErrorContains(t, err, "group web: the bootstrap data")
	require.ErrorContains(t, err, "EC2 allows 16384")

	for name, tc := range map[string]struct{ data, format, want string }{
		"ignition":     {`{"ignition":{"version":"3.4.0"}}`, "ignition", "ignition bootstrap data cannot travel"},
		"unknown":      {"apt-get install x", "", "neither #cloud-config nor #!"},
		"already MIME": {"Content-Type: multipart/mixed; boundary=x\n", "", "already a MIME multi-part"},
	} {
		req.UserData, req.UserDataFormat = []byte(tc.data), tc.format
		_, err := aws.ComposeUserData(script, req)
		require.ErrorContains(t, err, tc.want, name)
	}
}
