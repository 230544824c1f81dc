package controlplane

import (
	"context"
	"fmt"
	"os"
	"time"

	authv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/log"

	cpv1 "github.com/nstance-dev/nstance/api/controlplane/v1beta1"
	infrav1 "github.com/nstance-dev/nstance/api/v1beta1"
)

// TokenExpiryAnnotation on the kubeconfig Secret records when its token
// expires.
const TokenExpiryAnnotation = "nstance.dev/token-expires-at"

// KubeconfigSecretName is the Secret core Cluster API reads a cluster's
// kubeconfig from.
func KubeconfigSecretName(cluster string) string { return cluster + "-kubeconfig" }

// ensureKubeconfig refreshes the kubeconfig Secret of cluster when it is
// missing or its token is past two thirds of its life. It returns the
// Secret as it now is and when to look again.
func (r *Reconciler) ensureKubeconfig(ctx context.Context, cp *cpv1.NstanceControlPlane, cluster string) (*corev1.Secret, time.Duration, error) {
	name := KubeconfigSecretName(cluster)
	ttl := r.ttl()
	var cur corev1.Secret
	err := r.Client.Get(ctx, client.ObjectKey{Namespace: cp.Namespace, Name: name}, &cur)
	if err != nil && !apierrors.IsNotFound(err) {
		return nil, 0, fmt.Errorf("get kubeconfig Secret %s: %w", name, err)
	}
	if err == nil && metav1.IsControlledBy(&cur, cp) {
		if exp, perr := time.Parse(time.RFC3339, cur.Annotations[TokenExpiryAnnotation]); perr == nil {
			if wait := exp.Add(-ttl / 3).Sub(r.now()); wait > 0 {
				return &cur, wait, nil
			}
		}
	}
	if err := r.ensureServiceAccount(ctx, cp.Namespace); err != nil {
		return nil, 0, err
	}
	tr := &authv1.TokenRequest{Spec: authv1.TokenRequestSpec{ExpirationSeconds: ptr.To(int64(ttl.Seconds()))}}
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: cp.Namespace, Name: r.ServiceAccount}}
	if err := r.Client.SubResource("token").Create(ctx, sa, tr); err != nil {
		return nil, 0, fmt.Errorf("TokenRequest for ServiceAccount %s/%s: %w", cp.Namespace, r.ServiceAccount, err)
	}
	kubeconfig, err := BuildKubeconfig(cluster, r.APIServer, r.CAData, tr.Status.Token)
	if err != nil {
		return nil, 0, err
	}
	exp := tr.Status.ExpirationTimestamp.Time
	if exp.IsZero() {
		exp = r.now().Add(ttl)
	}
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: cp.Namespace, Name: name}}
	if _, err := controllerutil.CreateOrPatch(ctx, r.Client, secret, func() error {
		if secret.Labels == nil {
			secret.Labels = map[string]string{}
		}
		secret.Labels[clusterv1.ClusterNameLabel] = cluster
		if secret.Annotations == nil {
			secret.Annotations = map[string]string{}
		}
		secret.Annotations[TokenExpiryAnnotation] = exp.UTC().Format(time.RFC3339)
		if secret.CreationTimestamp.IsZero() {
			secret.Type = clusterv1.ClusterSecretType
		}
		secret.Data = map[string][]byte{"value": kubeconfig}
		dropLegacyOwner(secret)
		return controllerutil.SetControllerReference(cp, secret, r.Client.Scheme())
	}); err != nil {
		return nil, 0, fmt.Errorf("write kubeconfig Secret %s: %w", name, err)
	}
	log.FromContext(ctx).Info("kubeconfig Secret refreshed", "secret", name, "tokenExpires", exp)
	return secret, max(exp.Add(-ttl/3).Sub(r.now()), time.Second), nil
}

// dropLegacyOwner removes the controller reference to an NstanceCluster
// that operators before the NstanceControlPlane set on the Secret, so the
// control plane can take it over.
func dropLegacyOwner(s *corev1.Secret) {
	refs := s.OwnerReferences[:0]
	for _, ref := range s.OwnerReferences {
		if ref.Kind == "NstanceCluster" && ref.APIVersion == infrav1.GroupVersion.String() && ptr.Deref(ref.Controller, false) {
			continue
		}
		refs = append(refs, ref)
	}
	s.OwnerReferences = refs
}

func (r *Reconciler) ensureServiceAccount(ctx context.Context, namespace string) error {
	// Create-only: an existing ServiceAccount (e.g. from the Helm chart) is
	// kept, and the operator needs no read access to ServiceAccounts.
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: r.ServiceAccount}}
	if err := r.Client.Create(ctx, sa); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("ensure ServiceAccount %s/%s: %w", namespace, r.ServiceAccount, err)
	}
	return nil
}

// BuildKubeconfig renders a kubeconfig for a token.
func BuildKubeconfig(cluster, server string, caData []byte, token string) ([]byte, error) {
	user := cluster + "-nstance"
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters[cluster] = &clientcmdapi.Cluster{Server: server, CertificateAuthorityData: caData}
	cfg.AuthInfos[user] = &clientcmdapi.AuthInfo{Token: token}
	cfg.Contexts[cluster] = &clientcmdapi.Context{Cluster: cluster, AuthInfo: user}
	cfg.CurrentContext = cluster
	out, err := clientcmd.Write(*cfg)
	if err != nil {
		return nil, fmt.Errorf("render kubeconfig: %w", err)
	}
	return out, nil
}

// APIServerFrom returns the server URL and CA bytes of a rest.Config.
func APIServerFrom(cfg *rest.Config) (string, []byte, error) {
	ca := cfg.CAData
	if len(ca) == 0 && cfg.CAFile != "" {
		data, err := os.ReadFile(cfg.CAFile)
		if err != nil {
			return "", nil, fmt.Errorf("read API server CA %s: %w", cfg.CAFile, err)
		}
		ca = data
	}
	return cfg.Host, ca, nil
}
