package chaos

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/stretchr/testify/require"

	"github.com/nstance-dev/nstance/internal/agent/identity"
	"github.com/nstance-dev/nstance/internal/devs3/devs3test"
	"github.com/nstance-dev/nstance/internal/pki"
	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

// rotateDuringRun rotates the cluster CA with the nstance-admin binary
// while real agents and an operator-like client keep working: each phase
// waits until every party holds what the next one needs (the gates
// `switch` and `retire` enforce in production, skipped with --force here
// because the certificates live seconds): after introduce, every agent's
// CA chain and the operator's roots hold both CAs; after switch, the
// server presents and every agent holds a certificate of the new CA; after
// retire, the chains hold the new CA alone.
func rotateDuringRun(t *testing.T, st *stack, srv *server, c nstancev1.OperatorServiceClient, op *rotClient, agentDir string, ids []string, validity time.Duration) {
	t.Helper()
	wait := 3*validity + 30*time.Second // a server trust refresh (10 s) and two renewals
	renewOperator := func() []*x509.Certificate {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		resp, err := c.RenewCertificate(ctx, &nstancev1.RenewCertificateRequest{})
		if err != nil {
			return nil
		}
		leaf, err := pki.ParseCertificatePEM([]byte(resp.GetCertificatePem()))
		require.NoError(t, err)
		chain, err := pki.ParseCertificatesPEM([]byte(resp.GetCaChainPem()))
		require.NoError(t, err)
		op.setRoots(t, []byte(resp.GetCaChainPem()))
		cur := op.cert.Load()
		op.cert.Store(&tls.Certificate{Certificate: [][]byte{leaf.Raw}, PrivateKey: cur.PrivateKey, Leaf: leaf})
		return chain
	}
	agentChain := func(id string) []*x509.Certificate {
		b, err := os.ReadFile(filepath.Join(agentDir, id, "identity", identity.CAChainFile))
		if err != nil {
			return nil
		}
		certs, err := pki.ParseCertificatesPEM(b)
		if err != nil {
			return nil
		}
		return certs
	}
	agentLeaf := func(id string) *x509.Certificate {
		b, err := os.ReadFile(filepath.Join(agentDir, id, "identity", identity.CertFile))
		if err != nil {
			return nil
		}
		leaf, err := pki.ParseCertificatePEM(b)
		if err != nil {
			return nil
		}
		return leaf
	}
	signer := func() *x509.Certificate {
		out, err := devs3test.Client(st.s3URL).GetObject(context.Background(), &s3.GetObjectInput{Bucket: aws.String(devs3test.Bucket), Key: aws.String("cluster/ca.crt")})
		require.NoError(t, err)
		defer func() { _ = out.Body.Close() }()
		buf, err := io.ReadAll(out.Body)
		require.NoError(t, err)
		ca, err := pki.ParseCertificatePEM(buf)
		require.NoError(t, err)
		return ca
	}
	oldCA := signer()

	_, err := st.admin(t, "cluster", "rotate-ca", "introduce")
	require.NoError(t, err)
	require.Eventually(t, func() bool { return len(renewOperator()) == 2 }, wait, 500*time.Millisecond, "the operator's renewal hands out both CAs")
	for _, id := range ids {
		require.Eventually(t, func() bool { return len(agentChain(id)) == 2 }, wait, 250*time.Millisecond, "agent %s renewed with both CAs", id)
	}
	t.Logf("introduce: the operator and %d agents trust both CAs", len(ids))

	_, err = st.admin(t, "cluster", "rotate-ca", "switch", "--force")
	require.NoError(t, err)
	newCA := signer()
	require.False(t, newCA.Equal(oldCA))
	// Probed on the election port (HTTPS, a complete request): a client
	// that aborts a handshake would itself count as a failed handshake.
	probe := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{MinVersion: tls.VersionTLS13, InsecureSkipVerify: true}, DisableKeepAlives: true}}
	require.Eventually(t, func() bool {
		resp, err := probe.Get("https://" + srv.addr(8991) + "/health")
		if err != nil {
			return false
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		return resp.TLS != nil && resp.TLS.PeerCertificates[0].CheckSignatureFrom(newCA) == nil
	}, wait, 250*time.Millisecond, "the server presents a certificate of the new CA")
	require.Eventually(t, func() bool {
		renewOperator()
		return op.cert.Load().Leaf.CheckSignatureFrom(newCA) == nil
	}, wait, 500*time.Millisecond, "the operator's renewal is issued by the new CA")
	for _, id := range ids {
		require.Eventually(t, func() bool {
			leaf := agentLeaf(id)
			return leaf != nil && leaf.CheckSignatureFrom(newCA) == nil
		}, wait, 250*time.Millisecond, "agent %s renewed by the new CA", id)
	}
	t.Logf("switch: the server, the operator and %d agents hold certificates of the new CA", len(ids))

	_, err = st.admin(t, "cluster", "rotate-ca", "retire", "--force")
	require.NoError(t, err)
	require.Eventually(t, func() bool { return len(renewOperator()) == 1 }, wait, 500*time.Millisecond, "the operator's renewal drops the old CA")
	for _, id := range ids {
		require.Eventually(t, func() bool {
			chain := agentChain(id)
			return len(chain) == 1 && chain[0].Equal(newCA)
		}, wait, 250*time.Millisecond, "agent %s renewed with the new CA alone", id)
	}
	t.Logf("retire: the old CA is gone from every chain")
}
