package v1beta1_test

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/contract"
	"sigs.k8s.io/controller-runtime/pkg/client"

	cpv1 "github.com/nstance-dev/nstance/api/controlplane/v1beta1"
	infrav1 "github.com/nstance-dev/nstance/api/v1beta1"
	"github.com/nstance-dev/nstance/internal/testing/kubetest"
)

const (
	contractLabel = "cluster.x-k8s.io/v1beta2"
	contractValue = "v1beta1"
)

var wantKinds = []string{
	"NstanceCluster",
	"NstanceMachine",
	"NstanceMachinePool",
	"NstanceMachineTemplate",
	"NstanceShardGroup",
}

// controlPlaneKinds are the kinds of the control plane group
// (api/controlplane/v1beta1), generated and installed with ours.
var controlPlaneKinds = []string{"NstanceControlPlane"}

// groupOf is the API group of a kind of either package.
func groupOf(kind string) schema.GroupVersion {
	if slices.Contains(controlPlaneKinds, kind) {
		return cpv1.GroupVersion
	}
	return infrav1.GroupVersion
}

// registeredKinds are the Nstance object kinds AddToScheme registers.
func registeredKinds(t *testing.T) []string {
	t.Helper()
	var kinds []string
	for kind := range env.Scheme.KnownTypes(infrav1.GroupVersion) {
		if strings.HasPrefix(kind, "Nstance") && !strings.HasSuffix(kind, "List") {
			kinds = append(kinds, kind)
			require.True(t, env.Scheme.Recognizes(infrav1.GroupVersion.WithKind(kind+"List")), "%s has no list kind", kind)
		}
	}
	sort.Strings(kinds)
	return kinds
}

// TestCRDsFollowContract reads the installed CRDs back from the API server
// under the names Cluster API derives from group and kind, as its contract
// lookup does, and checks the metadata it relies on.
func TestCRDsFollowContract(t *testing.T) {
	require.Equal(t, wantKinds, registeredKinds(t))
	for _, kind := range controlPlaneKinds {
		require.True(t, env.Scheme.Recognizes(cpv1.GroupVersion.WithKind(kind)), kind)
		require.True(t, env.Scheme.Recognizes(cpv1.GroupVersion.WithKind(kind+"List")), kind)
	}
	for _, kind := range append(slices.Clone(wantKinds), controlPlaneKinds...) {
		gv := groupOf(kind)
		t.Run(kind, func(t *testing.T) {
			crd := &apiextensionsv1.CustomResourceDefinition{}
			name := contract.CalculateCRDName(gv.Group, kind)
			require.NoError(t, env.Client.Get(t.Context(), client.ObjectKey{Name: name}, crd))
			require.Equal(t, contractValue, crd.Labels[contractLabel])
			require.Equal(t, kind, crd.Spec.Names.Kind)
			require.Contains(t, crd.Spec.Names.Categories, "cluster-api")
			require.NotEmpty(t, crd.Spec.Names.ShortNames)
			require.Len(t, crd.Spec.Versions, 1)
			v := crd.Spec.Versions[0]
			require.Equal(t, gv.Version, v.Name)
			require.True(t, v.Served && v.Storage)
			require.NotNil(t, v.Subresources, "status subresource")
			require.NotNil(t, v.Subresources.Status, "status subresource")
			status := v.Schema.OpenAPIV3Schema.Properties["status"]
			conds, ok := status.Properties["conditions"]
			require.True(t, ok, "status.conditions")
			require.Equal(t, "map", ptr.Deref(conds.XListType, ""))
			require.Equal(t, []string{"type"}, conds.XListMapKeys)
		})
	}
}

// TestCAPIReferencesAccepted creates core Cluster API v1beta2 objects that
// point at Nstance objects; the CAPI CRDs installed next to ours validate
// the references.
func TestCAPIReferencesAccepted(t *testing.T) {
	ctx := t.Context()
	ns := newNamespace(t)

	nc := validCluster()
	nc.Namespace = ns
	create(t, nc)
	cluster := &clusterv1.Cluster{
		ObjectMeta: metav1.ObjectMeta{Name: "prod", Namespace: ns},
		Spec: clusterv1.ClusterSpec{
			InfrastructureRef: clusterv1.ContractVersionedObjectReference{
				APIGroup: infrav1.GroupVersion.Group, Kind: "NstanceCluster", Name: nc.Name,
			},
		},
	}
	create(t, cluster)

	pool := validPool()
	pool.Namespace = ns
	create(t, pool)
	mp := &clusterv1.MachinePool{
		ObjectMeta: metav1.ObjectMeta{Name: "workers", Namespace: ns},
		Spec: clusterv1.MachinePoolSpec{
			ClusterName:    cluster.Name,
			Replicas:       ptr.To[int32](4),
			FailureDomains: pool.Spec.Shards,
			Template: clusterv1.MachineTemplateSpec{
				Spec: clusterv1.MachineSpec{
					ClusterName: cluster.Name,
					Bootstrap:   clusterv1.Bootstrap{DataSecretName: ptr.To("workers-bootstrap")},
					InfrastructureRef: clusterv1.ContractVersionedObjectReference{
						APIGroup: infrav1.GroupVersion.Group, Kind: "NstanceMachinePool", Name: pool.Name,
					},
				},
			},
		},
	}
	create(t, mp)

	machine := validMachine()
	machine.Namespace = ns
	create(t, machine)
	m := &clusterv1.Machine{
		ObjectMeta: metav1.ObjectMeta{Name: "gpu-7", Namespace: ns},
		Spec: clusterv1.MachineSpec{
			ClusterName:   cluster.Name,
			Bootstrap:     clusterv1.Bootstrap{DataSecretName: ptr.To("gpu-bootstrap")},
			FailureDomain: "us-west-2a",
			InfrastructureRef: clusterv1.ContractVersionedObjectReference{
				APIGroup: infrav1.GroupVersion.Group, Kind: "NstanceMachine", Name: machine.Name,
			},
		},
	}
	create(t, m)

	// Read back: the references survived the CAPI schemas unchanged.
	gotCluster := &clusterv1.Cluster{}
	require.NoError(t, env.Client.Get(ctx, client.ObjectKeyFromObject(cluster), gotCluster))
	require.Equal(t, cluster.Spec.InfrastructureRef, gotCluster.Spec.InfrastructureRef)
	gotMP := &clusterv1.MachinePool{}
	require.NoError(t, env.Client.Get(ctx, client.ObjectKeyFromObject(mp), gotMP))
	require.Equal(t, mp.Spec.Template.Spec.InfrastructureRef, gotMP.Spec.Template.Spec.InfrastructureRef)
	require.Equal(t, []string{"us-west-2a", "us-east-1a"}, gotMP.Spec.FailureDomains)
	gotM := &clusterv1.Machine{}
	require.NoError(t, env.Client.Get(ctx, client.ObjectKeyFromObject(m), gotM))
	require.Equal(t, m.Spec.InfrastructureRef, gotM.Spec.InfrastructureRef)

	// Every reference names a kind that exists in our group.
	for _, kind := range []string{
		gotCluster.Spec.InfrastructureRef.Kind,
		gotMP.Spec.Template.Spec.InfrastructureRef.Kind,
		gotM.Spec.InfrastructureRef.Kind,
	} {
		require.True(t, env.Scheme.Recognizes(infrav1.GroupVersion.WithKind(kind)), kind)
	}
}

// TestKubectlPrinterColumns runs the real kubectl against the API server.
func TestKubectlPrinterColumns(t *testing.T) {
	ns := newNamespace(t)

	pool := validPool()
	pool.Namespace = ns
	create(t, pool)
	pool.Status = validPool().Status
	pool.Status.Replicas, pool.Status.ReadyReplicas = 5, 4
	require.NoError(t, env.Client.Status().Update(t.Context(), pool))

	sg := validShardGroup()
	sg.Namespace = ns
	create(t, sg)
	sg.Status = validShardGroup().Status
	require.NoError(t, env.Client.Status().Update(t.Context(), sg))

	machine := validMachine()
	machine.Namespace = ns
	create(t, machine)
	machine.Status = validMachine().Status
	require.NoError(t, env.Client.Status().Update(t.Context(), machine))

	tests := []struct {
		args       []string
		wantHeader []string
		// wantRow are the leading fields of the single data row.
		wantRow []string
	}{
		{
			args:       []string{"get", "nstancemachinepools"},
			wantHeader: []string{"NAME", "GROUP", "SHARDS", "REPLICAS", "READY", "UP-TO-DATE", "AGE"},
			wantRow:    []string{"workers", "workers", `["us-west-2a","us-east-1a"]`, "5", "4", "3"},
		},
		{
			args:       []string{"get", "nmp", "-o", "wide"},
			wantHeader: []string{"NAME", "GROUP", "SHARDS", "REPLICAS", "READY", "UP-TO-DATE", "ROLLING-OUT", "TEMPLATE", "IMAGE", "INSTANCE-TYPE", "AGE"},
			wantRow:    []string{"workers", "workers", `["us-west-2a","us-east-1a"]`, "5", "4", "3", "True", "general", "ami-0123456789abcdef0", "m7i.large"},
		},
		{
			args:       []string{"get", "nsg"},
			wantHeader: []string{"NAME", "GROUP", "SHARD", "SIZE", "REPLICAS", "READY", "UP-TO-DATE", "AGE"},
			wantRow:    []string{"workers--us-west-2a", "workers", "us-west-2a", "3", "3", "2", "1"},
		},
		{
			args:       []string{"get", "nm"},
			wantHeader: []string{"NAME", "SHARD", "PROVIDERID", "READY", "AGE"},
			wantRow:    []string{"gpu-7", "us-west-2a", "nstance://us-west-2a/i-7", "true"},
		},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			cmd := env.Kubectl(t.Context(), append(tt.args, "-n", ns)...)
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			require.NoError(t, cmd.Run(), "kubectl: %s", stderr.String())
			lines := strings.Split(strings.TrimSpace(stdout.String()), "\n")
			require.Len(t, lines, 2, "header and one row:\n%s", stdout.String())
			require.Equal(t, tt.wantHeader, strings.Fields(lines[0]))
			row := strings.Fields(lines[1])
			require.Len(t, row, len(tt.wantHeader))
			require.Equal(t, tt.wantRow, row[:len(tt.wantRow)])
		})
	}
}

// TestKustomizeRendersCRDs renders config/crd with kubectl's built-in
// kustomize and checks it holds exactly the generated bases, labelled.
func TestKustomizeRendersCRDs(t *testing.T) {
	root, err := kubetest.RepoRoot()
	require.NoError(t, err)

	var stdout, stderr bytes.Buffer
	cmd := env.Kubectl(t.Context(), "kustomize", filepath.Join(root, "config", "crd"))
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	require.NoError(t, cmd.Run(), "kubectl kustomize: %s", stderr.String())
	rendered := decodeCRDs(t, &stdout)

	bases, err := filepath.Glob(filepath.Join(root, "config", "crd", "bases", "*.yaml"))
	require.NoError(t, err)
	var baseNames []string
	for _, path := range bases {
		f, err := os.Open(path)
		require.NoError(t, err)
		crds := decodeCRDs(t, f)
		require.NoError(t, f.Close())
		require.Len(t, crds, 1, path)
		baseNames = append(baseNames, crds[0].Name)
	}
	sort.Strings(baseNames)

	var renderedNames, renderedKinds []string
	for _, crd := range rendered {
		renderedNames = append(renderedNames, crd.Name)
		renderedKinds = append(renderedKinds, crd.Spec.Names.Kind)
		require.Equal(t, contractValue, crd.Labels[contractLabel], crd.Name)
		require.Equal(t, groupOf(crd.Spec.Names.Kind).Group, crd.Spec.Group)
	}
	sort.Strings(renderedNames)
	slices.Sort(renderedKinds)
	require.Equal(t, baseNames, renderedNames, "kustomization must list every generated base")
	all := append(slices.Clone(wantKinds), controlPlaneKinds...)
	slices.Sort(all)
	require.Equal(t, all, renderedKinds)
}

func decodeCRDs(t *testing.T, r io.Reader) []apiextensionsv1.CustomResourceDefinition {
	t.Helper()
	dec := yaml.NewYAMLOrJSONDecoder(r, 4096)
	var out []apiextensionsv1.CustomResourceDefinition
	for {
		var crd apiextensionsv1.CustomResourceDefinition
		err := dec.Decode(&crd)
		if errors.Is(err, io.EOF) {
			return out
		}
		require.NoError(t, err)
		if crd.Name == "" {
			continue
		}
		require.Equal(t, "CustomResourceDefinition", crd.Kind)
		out = append(out, crd)
	}
}
