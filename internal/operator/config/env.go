package config

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// Environment variable names and their defaults.
const (
	EnvNamespace          = "NSTANCE_NAMESPACE"
	EnvCAConfigMap        = "NSTANCE_CA_CONFIGMAP"
	EnvCertSecret         = "NSTANCE_CERT_SECRET"
	EnvKeySecret          = "NSTANCE_KEY_SECRET"
	EnvNonceSecret        = "NSTANCE_NONCE_SECRET"
	EnvCAPIEndpoint       = "NSTANCE_CAPI_ENDPOINT"
	EnvCAPIServiceAccount = "NSTANCE_CAPI_SERVICEACCOUNT"
	EnvK8sJSON            = "NSTANCE_K8S_JSON"

	DefaultCAConfigMap        = "nstance-cluster-ca"
	DefaultCertSecret         = "nstance-operator-cert"
	DefaultKeySecret          = "nstance-operator-key"
	DefaultNonceSecret        = "nstance-operator-nonce"
	DefaultCAPIServiceAccount = "nstance-capi-workload"

	// serviceAccountNamespaceFile holds the pod's namespace in-cluster.
	serviceAccountNamespaceFile = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"
)

// Env is the operator's environment configuration.
type Env struct {
	// Namespace holds every object the operator reads or writes.
	Namespace string
	// CAConfigMap holds the cluster CA certificate under ca.crt.
	CAConfigMap string
	// CertSecret holds the client certificate (tls.crt, tls.key).
	CertSecret string
	// KeySecret holds the Ed25519 keypair (private.key, public.key).
	KeySecret string
	// NonceSecret holds the registration nonce (nonce.jwt).
	NonceSecret string
	// CAPIEndpoint, when set, turns off kubeconfig Secret management.
	CAPIEndpoint string
	// CAPIServiceAccount is the ServiceAccount whose tokens go into the
	// managed kubeconfig Secret.
	CAPIServiceAccount string
	// K8sJSON selects JSON instead of protobuf for Kubernetes API calls.
	K8sJSON bool
}

// EnvFromOS reads the environment of the process. The namespace falls back to
// the pod's own namespace from the mounted ServiceAccount.
func EnvFromOS() (Env, error) {
	return ParseEnv(os.Getenv, PodNamespace)
}

// PodNamespace reads the namespace of the pod the process runs in from its
// mounted ServiceAccount.
func PodNamespace() (string, error) {
	data, err := os.ReadFile(serviceAccountNamespaceFile)
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(string(data)), nil
}

// ParseEnv builds an Env from getenv, calling podNamespace only when
// NSTANCE_NAMESPACE is empty.
func ParseEnv(getenv func(string) string, podNamespace func() (string, error)) (Env, error) {
	get := func(name, def string) string {
		if v := strings.TrimSpace(getenv(name)); v != "" {
			return v
		}
		return def
	}
	e := Env{
		Namespace:          get(EnvNamespace, ""),
		CAConfigMap:        get(EnvCAConfigMap, DefaultCAConfigMap),
		CertSecret:         get(EnvCertSecret, DefaultCertSecret),
		KeySecret:          get(EnvKeySecret, DefaultKeySecret),
		NonceSecret:        get(EnvNonceSecret, DefaultNonceSecret),
		CAPIEndpoint:       get(EnvCAPIEndpoint, ""),
		CAPIServiceAccount: get(EnvCAPIServiceAccount, DefaultCAPIServiceAccount),
	}
	if raw := get(EnvK8sJSON, ""); raw != "" {
		v, err := strconv.ParseBool(raw)
		if err != nil {
			return Env{}, fmt.Errorf("%s=%q: want true or false", EnvK8sJSON, raw)
		}
		e.K8sJSON = v
	}
	if e.Namespace == "" {
		ns, err := podNamespace()
		if err != nil || ns == "" {
			return Env{}, errors.New(EnvNamespace + " is not set and the pod namespace is not available; set " + EnvNamespace)
		}
		e.Namespace = ns
	}
	return e, nil
}
