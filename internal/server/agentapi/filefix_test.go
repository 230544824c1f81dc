package agentapi_test

import (
	"crypto/ed25519"
	"crypto/rand"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nstance-dev/nstance/internal/config"
	"github.com/nstance-dev/nstance/internal/server/agentapi"
	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
	"github.com/nstance-dev/nstance/test/agent/agenttest"
)

func TestFileRemedy(t *testing.T) {
	ok := func(p string) *nstancev1.FileStatus {
		return &nstancev1.FileStatus{Path: p, State: nstancev1.FileState_FILE_STATE_OK}
	}
	bad := func(p string) *nstancev1.FileStatus {
		return &nstancev1.FileStatus{Path: p, State: nstancev1.FileState_FILE_STATE_ERROR, Message: "no space left on device"}
	}
	certs := map[string]string{"tls.crt": "tls", "ca/tls.crt": "tls", "kubelet.crt": "kubelet"}
	planned := map[string]bool{"tls.crt": true, "ca/tls.crt": true, "kubelet.crt": true, "role.txt": true}
	for _, tc := range []struct {
		name  string
		files []*nstancev1.FileStatus
		want  agentapi.Remedy
	}{
		{"all fine", []*nstancev1.FileStatus{ok("tls.crt"), ok("role.txt")}, agentapi.Remedy{}},
		{"a plain file: resend", []*nstancev1.FileStatus{ok("tls.crt"), bad("role.txt")},
			agentapi.Remedy{Resend: true, Paths: []string{"role.txt"}}},
		{"a certificate file: reissue and resend", []*nstancev1.FileStatus{bad("tls.crt"), bad("role.txt")},
			agentapi.Remedy{Resend: true, Reissue: []string{"tls"}, Paths: []string{"role.txt", "tls.crt"}}},
		{"two files of one key: reissued once", []*nstancev1.FileStatus{bad("tls.crt"), bad("ca/tls.crt"), bad("kubelet.crt")},
			agentapi.Remedy{Resend: true, Reissue: []string{"kubelet", "tls"}, Paths: []string{"ca/tls.crt", "kubelet.crt", "tls.crt"}}},
		{"a path no longer planned: left to the next delivery", []*nstancev1.FileStatus{bad("old.txt")}, agentapi.Remedy{}},
		{"unspecified state is no error", []*nstancev1.FileStatus{{Path: "role.txt"}}, agentapi.Remedy{}},
	} {
		t.Run(tc.name, func(t *testing.T) { require.Equal(t, tc.want, agentapi.FileRemedy(tc.files, certs, planned)) })
	}
}

// A certificate file reported in error gets a new certificate: the next
// delivery carries another certificate for the same key (a new hash).
func TestRemedyFilesReissuesTheCertificate(t *testing.T) {
	tmpl := config.Template{Keys: map[string]config.TemplateKey{
		"ed": {Type: "ed25519", Certificate: &config.TemplateCertificate{CommonName: "{{ .InstanceID }}", Usages: []string{"server_auth"}}},
	}, Files: map[string]config.TemplateFile{
		"ed.crt":   {Kind: "certificate", Key: "ed"},
		"role.txt": {Kind: "string", Content: "worker"},
	}}
	s := newShard(t, tmpl)
	ctx := agentCtx("i-1")
	ref := agentapi.Ref{InstanceID: "i-1", Tenant: agenttest.Tenant}
	edPub, _, _ := ed25519.GenerateKey(rand.Reader)
	_, err := s.Agent.SubmitPublicKeys(ctx, &nstancev1.SubmitPublicKeysRequest{Keys: []*nstancev1.PublicKey{
		{Name: "ed", Type: nstancev1.KeyType_KEY_TYPE_ED25519, PublicKeyPem: pubPEM(t, edPub)}}})
	require.NoError(t, err)
	before, err := s.Agent.Delivery(ctx, ref)
	require.NoError(t, err)
	require.Len(t, before.GetFiles(), 2)

	// A plain file in error: resent, nothing reissued.
	r, err := s.Agent.RemedyFiles(ctx, ref, []*nstancev1.FileStatus{{Path: "role.txt", State: nstancev1.FileState_FILE_STATE_ERROR}})
	require.NoError(t, err)
	require.Equal(t, agentapi.Remedy{Resend: true, Paths: []string{"role.txt"}}, r)
	same, err := s.Agent.Delivery(ctx, ref)
	require.NoError(t, err)
	require.Equal(t, before.GetConfigHash(), same.GetConfigHash())

	r, err = s.Agent.RemedyFiles(ctx, ref, []*nstancev1.FileStatus{{Path: "ed.crt", State: nstancev1.FileState_FILE_STATE_ERROR, Message: "bad certificate"}})
	require.NoError(t, err)
	require.Equal(t, []string{"ed"}, r.Reissue)
	after, err := s.Agent.Delivery(ctx, ref)
	require.NoError(t, err)
	require.NotEqual(t, before.GetConfigHash(), after.GetConfigHash(), "a new certificate")
	cert := func(d *nstancev1.FileDelivery) []byte {
		for _, f := range d.GetFiles() {
			if f.GetPath() == "ed.crt" {
				return f.GetContent()
			}
		}
		t.Fatal("no ed.crt")
		return nil
	}
	require.NotEqual(t, cert(before), cert(after))
}
