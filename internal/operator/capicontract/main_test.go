package capicontract_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"os"
	"testing"
	"time"

	"github.com/go-logr/logr"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/nstance-dev/nstance/internal/testing/kubetest"
)

// env is one API server for the package; each test uses its own namespace.
// It authorizes as a production cluster does (Node,RBAC with the
// NodeRestriction admission plugin) and trusts client certificates of the
// node CA, which the node tests import into Nstance as the CA "kubernetes".
var env *kubetest.Env

// nodeCACert and nodeCAKey are that node CA (PEM).
var nodeCACert, nodeCAKey []byte

// agentBinDir holds the agent binary the node tests built (empty: none).
var agentBinDir string

// clusterB is the workload cluster of the management-mode test, a second
// API server started by the first test that needs it.
var clusterB kubetest.Lazy

func TestMain(m *testing.M) {
	ctrllog.SetLogger(logr.Discard())
	var err error
	if nodeCACert, nodeCAKey, err = newNodeCA(); err != nil {
		fmt.Fprintln(os.Stderr, "node CA:", err)
		os.Exit(1)
	}
	code := kubetest.RunMainWith(m, &env, kubetest.Options{
		ClientCAs: nodeCACert,
		APIServerArgs: map[string]string{
			"authorization-mode": "Node,RBAC", "enable-admission-plugins": "NodeRestriction",
		},
	})
	if agentBinDir != "" {
		os.RemoveAll(agentBinDir)
	}
	if err := clusterB.Stop(); err != nil {
		fmt.Fprintf(os.Stderr, "stop second envtest: %v\n", err)
		if code == 0 {
			code = 1
		}
	}
	os.Exit(code)
}

// newNodeCA makes the CA a workload cluster's API server trusts for
// kubelets (as kubeadm's cluster CA would be).
func newNodeCA() (certPEM, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "kubernetes"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, err
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), nil
}
