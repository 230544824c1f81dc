package clusterctl

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"slices"
	"strconv"
	"time"

	authv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/log"

	infrav1 "github.com/nstance-dev/nstance/api/v1beta1"
	"github.com/nstance-dev/nstance/internal/operator/paused"
)

// Annotation on the kubeconfig Secret recording when its token expires.
const TokenExpiryAnnotation = "nstance.dev/token-expires-at"

// Reconciler reconciles NstanceClusters.
type Reconciler struct {
	Client client.Client
	// Shards are the configured shard IDs: the failure domains.
	Shards []string
	// ManageKubeconfig is false when NSTANCE_CAPI_ENDPOINT is set.
	ManageKubeconfig bool
	// ServiceAccount whose tokens go into the kubeconfig.
	ServiceAccount string
	// APIServer is where the kubeconfig points (the API server the operator
	// itself uses) and CAData its CA.
	APIServer string
	CAData    []byte
	// TokenTTL is the requested token lifetime; zero means 24h. Tokens are
	// re-requested once two thirds of it has passed.
	TokenTTL time.Duration
	Now      func() time.Time
}

// +kubebuilder:rbac:groups=infrastructure.cluster.x-k8s.io,resources=nstanceclusters,verbs=get;list;watch;create;update;patch
// +kubebuilder:rbac:groups=infrastructure.cluster.x-k8s.io,resources=nstanceclusters/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=cluster.x-k8s.io,resources=clusters,verbs=get;list;watch;create
// +kubebuilder:rbac:groups="",namespace=nstance-system,resources=secrets,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups="",namespace=nstance-system,resources=serviceaccounts,verbs=create
// +kubebuilder:rbac:groups="",namespace=nstance-system,resources=serviceaccounts/token,verbs=create

func (r *Reconciler) now() time.Time {
	if r.Now != nil {
		return r.Now()
	}
	return time.Now()
}

func (r *Reconciler) ttl() time.Duration {
	if r.TokenTTL > 0 {
		return r.TokenTTL
	}
	return 24 * time.Hour
}

// SetupWithManager registers the controller.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).
		Named("nstancecluster").
		For(&infrav1.NstanceCluster{}).
		Owns(&corev1.Secret{}).
		Complete(r)
}

// Reconcile implements reconcile.Reconciler.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	var nc infrav1.NstanceCluster
	if err := r.Client.Get(ctx, req.NamespacedName, &nc); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if !nc.DeletionTimestamp.IsZero() {
		return ctrl.Result{}, nil
	}
	if p, err := paused.Check(ctx, r.Client, nc.Namespace, &nc); err != nil {
		return ctrl.Result{}, err
	} else if p {
		return ctrl.Result{}, nil
	}
	before := nc.Status.DeepCopy()
	nc.Status.FailureDomains = nil
	for _, s := range slices.Sorted(slices.Values(r.Shards)) {
		nc.Status.FailureDomains = append(nc.Status.FailureDomains, infrav1.FailureDomain{Name: s, ControlPlane: ptr.To(false)})
	}
	nc.Status.Ready = true
	nc.Status.Initialization.Provisioned = ptr.To(true)
	nc.Status.ObservedGeneration = nc.Generation
	meta.SetStatusCondition(&nc.Status.Conditions, metav1.Condition{
		Type: infrav1.ReadyCondition, Status: metav1.ConditionTrue, Reason: infrav1.SyncedReason, ObservedGeneration: nc.Generation,
	})
	if !equality.Semantic.DeepEqual(before, &nc.Status) {
		if err := r.Client.Status().Update(ctx, &nc); err != nil {
			return ctrl.Result{}, fmt.Errorf("update NstanceCluster status: %w", err)
		}
	}
	if !r.ManageKubeconfig {
		return ctrl.Result{}, nil
	}
	next, err := r.ensureKubeconfig(ctx, &nc)
	if err != nil {
		return ctrl.Result{}, err
	}
	return ctrl.Result{RequeueAfter: next}, nil
}

// ClusterName is the CAPI Cluster an NstanceCluster belongs to: its owner,
// else its cluster-name label, else its own name.
func ClusterName(nc *infrav1.NstanceCluster) string {
	for _, ref := range nc.OwnerReferences {
		if ref.Kind == "Cluster" {
			return ref.Name
		}
	}
	if n := nc.Labels[clusterv1.ClusterNameLabel]; n != "" {
		return n
	}
	return nc.Name
}

// ensureKubeconfig refreshes the kubeconfig Secret when its token is past
// two thirds of its life, and returns when to look again.
func (r *Reconciler) ensureKubeconfig(ctx context.Context, nc *infrav1.NstanceCluster) (time.Duration, error) {
	cluster := ClusterName(nc)
	name := cluster + "-kubeconfig"
	ttl := r.ttl()
	var cur corev1.Secret
	err := r.Client.Get(ctx, client.ObjectKey{Namespace: nc.Namespace, Name: name}, &cur)
	if err != nil && !apierrors.IsNotFound(err) {
		return 0, fmt.Errorf("get kubeconfig Secret: %w", err)
	}
	if err == nil {
		if exp, perr := time.Parse(time.RFC3339, cur.Annotations[TokenExpiryAnnotation]); perr == nil {
			refreshAt := exp.Add(-ttl / 3)
			if wait := refreshAt.Sub(r.now()); wait > 0 {
				return wait, nil
			}
		}
	}
	if err := r.ensureServiceAccount(ctx, nc.Namespace); err != nil {
		return 0, err
	}
	tr := &authv1.TokenRequest{Spec: authv1.TokenRequestSpec{ExpirationSeconds: ptr.To(int64(ttl.Seconds()))}}
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: nc.Namespace, Name: r.ServiceAccount}}
	if err := r.Client.SubResource("token").Create(ctx, sa, tr); err != nil {
		return 0, fmt.Errorf("TokenRequest for ServiceAccount %s/%s: %w", nc.Namespace, r.ServiceAccount, err)
	}
	kubeconfig, err := BuildKubeconfig(cluster, r.APIServer, r.CAData, tr.Status.Token)
	if err != nil {
		return 0, err
	}
	exp := tr.Status.ExpirationTimestamp.Time
	if exp.IsZero() {
		exp = r.now().Add(ttl)
	}
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: nc.Namespace, Name: name}}
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
		return controllerutil.SetControllerReference(nc, secret, r.Client.Scheme())
	}); err != nil {
		return 0, fmt.Errorf("write kubeconfig Secret %s: %w", name, err)
	}
	log.FromContext(ctx).Info("kubeconfig Secret refreshed", "secret", name, "tokenExpires", exp)
	wait := exp.Add(-ttl / 3).Sub(r.now())
	return max(wait, time.Second), nil
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
		data, err := readFile(cfg.CAFile)
		if err != nil {
			return "", nil, fmt.Errorf("read API server CA %s: %w", cfg.CAFile, err)
		}
		ca = data
	}
	return cfg.Host, ca, nil
}

// Endpoint splits an API server URL (or host:port) into an APIEndpoint.
func Endpoint(server string) (infrav1.APIEndpoint, error) {
	host := server
	if u, err := url.Parse(server); err == nil && u.Host != "" {
		host = u.Host
	}
	h, p, err := net.SplitHostPort(host)
	if err != nil {
		return infrav1.APIEndpoint{Host: host, Port: 443}, nil
	}
	port, err := strconv.ParseInt(p, 10, 32)
	if err != nil || port < 1 || port > 65535 {
		return infrav1.APIEndpoint{}, fmt.Errorf("API server %q: bad port", server)
	}
	return infrav1.APIEndpoint{Host: h, Port: int32(port)}, nil
}

// EnsureObjects creates the NstanceCluster and CAPI Cluster named name when
// they do not exist. Existing objects are left as they are.
func EnsureObjects(ctx context.Context, c client.Client, namespace, name string, endpoint infrav1.APIEndpoint) error {
	nc := &infrav1.NstanceCluster{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name, Labels: map[string]string{clusterv1.ClusterNameLabel: name}},
		Spec:       infrav1.NstanceClusterSpec{ControlPlaneEndpoint: endpoint},
	}
	if err := c.Create(ctx, nc); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create NstanceCluster %s/%s: %w", namespace, name, err)
	}
	cl := &clusterv1.Cluster{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name},
		Spec: clusterv1.ClusterSpec{
			InfrastructureRef: clusterv1.ContractVersionedObjectReference{
				APIGroup: infrav1.GroupVersion.Group, Kind: "NstanceCluster", Name: name,
			},
		},
	}
	if err := c.Create(ctx, cl); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create Cluster %s/%s: %w", namespace, name, err)
	}
	return nil
}
