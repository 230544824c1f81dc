package manager_test

import (
	"bytes"
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/conditions"
	"sigs.k8s.io/controller-runtime/pkg/client"

	infrav1 "github.com/nstance-dev/nstance/api/v1beta1"
	"github.com/nstance-dev/nstance/internal/operator/machine"
	"github.com/nstance-dev/nstance/internal/operator/userdata"
	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

// calls records the CreateInstance and UpsertGroup requests the operator
// sends, as they leave it (a client interceptor on its shard connections).
// The server of this branch ignores user data, so what the operator sent
// is checked here; GroupStatus/InstanceStatus.user_data_sha256 is checked
// too once the server reports it.
type calls struct {
	mu      sync.Mutex
	creates []*nstancev1.CreateInstanceRequest
	upserts []*nstancev1.UpsertGroupRequest
}

// maxUserData stands in for the server's limit on user data (16 KiB by
// default), which the server of this branch does not enforce yet: a larger
// request is refused with InvalidArgument before it leaves the operator.
const maxUserData = 16 << 10

func (c *calls) intercept(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	c.mu.Lock()
	var data []byte
	switch r := req.(type) {
	case *nstancev1.CreateInstanceRequest:
		c.creates = append(c.creates, proto.Clone(r).(*nstancev1.CreateInstanceRequest))
		data = r.GetUserData()
	case *nstancev1.UpsertGroupRequest:
		c.upserts = append(c.upserts, proto.Clone(r).(*nstancev1.UpsertGroupRequest))
		data = r.GetGroup().GetUserData()
	}
	c.mu.Unlock()
	if len(data) > maxUserData {
		return status.Errorf(codes.InvalidArgument, "user data is %d bytes, more than the shard's limit of %d", len(data), maxUserData)
	}
	return invoker(ctx, method, req, reply, cc, opts...)
}

// createsFor returns the CreateInstance requests of NstanceMachine name.
func (c *calls) createsFor(name string) []*nstancev1.CreateInstanceRequest {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []*nstancev1.CreateInstanceRequest
	for _, r := range c.creates {
		if r.GetLabels()["nstance.dev/machine"] == name {
			out = append(out, r)
		}
	}
	return out
}

// upsertsOf returns the UpsertGroup requests for group.
func (c *calls) upsertsOf(group string) []*nstancev1.UpsertGroupRequest {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []*nstancev1.UpsertGroupRequest
	for _, r := range c.upserts {
		if r.GetGroup().GetGroupId() == group {
			out = append(out, r)
		}
	}
	return out
}

// upsertedWith reports whether group was upserted with data in format.
func (c *calls) upsertedWith(group string, data []byte, format string) bool {
	for _, r := range c.upsertsOf(group) {
		if bytes.Equal(r.GetGroup().GetUserData(), data) && r.GetGroup().GetUserDataFormat() == format {
			return true
		}
	}
	return false
}

func (f *fixture) bootstrapSecret(t testing.TB, name string, data map[string][]byte) {
	t.Helper()
	require.NoError(t, env.Client.Create(context.Background(), &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: name}, Type: clusterv1.ClusterSecretType, Data: data,
	}))
}

// startRecorded starts the operator with its shard calls recorded.
func startRecorded(t *testing.T, f *fixture) *calls {
	t.Helper()
	c := &calls{}
	o := f.options(t)
	o.MachinePollInterval = 100 * time.Millisecond
	o.ShardDialOptions = []grpc.DialOption{grpc.WithChainUnaryInterceptor(c.intercept)}
	r := startOperator(t, o)
	r.waitImported(t)
	return c
}

// setMachineSecret sets a Machine's spec.bootstrap.dataSecretName.
func setMachineSecret(t testing.TB, ns, name, secret string) {
	t.Helper()
	require.Eventually(t, func() bool {
		var m clusterv1.Machine
		if err := env.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, &m); err != nil {
			return false
		}
		m.Spec.Bootstrap.DataSecretName = ptr.To(secret)
		return env.Client.Update(context.Background(), &m) == nil
	}, 10*time.Second, tick)
}

// machineCondition returns the reason of an NstanceMachine's condition.
func machineCondition(t testing.TB, ns, name, typ string) string {
	t.Helper()
	nm, ok := get(t, ns, name, &infrav1.NstanceMachine{})
	if !ok {
		return ""
	}
	if c := conditions.Get(nm, typ); c != nil {
		return c.Reason
	}
	return ""
}

func TestMachineBootstrapData(t *testing.T) {
	f := newFixture(t, "shard-a")
	f.putNonce(t)
	rec := startRecorded(t, f)
	f.createPool(t, "boot", 0, "shard-a")
	f.waitGroupOnShards(t, "boot", "shard-a")

	// A Machine whose bootstrap provider has not written its Secret yet.
	f.machinePairBootstrap(t, "m-boot", "boot", nil)
	require.Eventually(t, func() bool {
		return machineCondition(t, f.ns, "m-boot", machine.ConditionInstanceCreated) == infrav1.WaitingForBootstrapDataReason &&
			machineCondition(t, f.ns, "m-boot", machine.ConditionReady) == infrav1.WaitingForBootstrapDataReason
	}, waitLong, tick)
	time.Sleep(time.Second)
	require.Empty(t, rec.createsFor("m-boot"), "no CreateInstance before the bootstrap data exists")

	value := []byte("#cloud-config\nruncmd:\n  - [sh, -c, 'echo joined']\n")
	f.bootstrapSecret(t, "m-boot-bootstrap", map[string][]byte{"value": value})
	setMachineSecret(t, f.ns, "m-boot", "m-boot-bootstrap")
	nm := waitMachineRunning(t, f.ns, "m-boot")
	creates := rec.createsFor("m-boot")
	require.NotEmpty(t, creates)
	for _, r := range creates {
		require.Equal(t, value, r.GetUserData(), "CreateInstance carries the Secret's value")
		require.Equal(t, userdata.FormatCloudConfig, r.GetUserDataFormat(), "the format defaults to cloud-config")
	}
	resp, err := f.shards["shard-a"].client(t).GetInstanceStatus(context.Background(), &nstancev1.GetInstanceStatusRequest{
		Lookup: &nstancev1.GetInstanceStatusRequest_InstanceId{InstanceId: nm.Status.InstanceID}})
	require.NoError(t, err)
	require.Equal(t, userdata.Hash(value), resp.GetInstance().GetUserDataSha256(), "the instance booted with exactly the bytes sent")

	// A Secret without "value": conditions and a Warning Event, no create.
	f.bootstrapSecret(t, "m-bad-bootstrap", map[string][]byte{"format": []byte("cloud-config")})
	f.machinePairBootstrap(t, "m-bad", "boot", ptr.To("m-bad-bootstrap"))
	require.Eventually(t, func() bool {
		return machineCondition(t, f.ns, "m-bad", machine.ConditionInstanceCreated) == infrav1.BootstrapDataSecretInvalidReason
	}, waitLong, tick)
	require.Eventually(t, func() bool {
		return len(f.events(t, "NstanceMachine", "m-bad", infrav1.BootstrapDataSecretInvalidReason)) > 0
	}, waitLong, tick)
	note := f.events(t, "NstanceMachine", "m-bad", infrav1.BootstrapDataSecretInvalidReason)[0]
	require.Contains(t, note, "m-bad-bootstrap")
	require.Empty(t, rec.createsFor("m-bad"))

	// Data above the server's limit: the refusal names the Machine and the
	// Secret (BootstrapDataRejected, a Warning Event).
	f.bootstrapSecret(t, "m-big-bootstrap", map[string][]byte{"value": bytes.Repeat([]byte("#"), maxUserData+1)})
	f.machinePairBootstrap(t, "m-big", "boot", ptr.To("m-big-bootstrap"))
	require.Eventually(t, func() bool {
		return machineCondition(t, f.ns, "m-big", machine.ConditionInstanceCreated) == infrav1.BootstrapDataRejectedReason
	}, waitLong, tick)
	require.Eventually(t, func() bool {
		return len(f.events(t, "NstanceMachine", "m-big", infrav1.BootstrapDataRejectedReason)) > 0
	}, waitLong, tick)
	note = f.events(t, "NstanceMachine", "m-big", infrav1.BootstrapDataRejectedReason)[0]
	require.Contains(t, note, "Machine m-big")
	require.Contains(t, note, "m-big-bootstrap")
	require.Contains(t, note, "limit")

	// An empty dataSecretName (what on-demand and imported Machines carry):
	// no waiting, no user data, the template's userdata applies.
	f.machinePair(t, "m-none", "boot", "shard-a")
	waitMachineRunning(t, f.ns, "m-none")
	for _, r := range rec.createsFor("m-none") {
		require.Empty(t, r.GetUserData())
	}
}

// machinePairBootstrap is machinePair (failure domain shard-a) with the
// Machine's spec.bootstrap.dataSecretName set to secret (nil: not yet).
func (f *fixture) machinePairBootstrap(t testing.TB, name, group string, secret *string) {
	t.Helper()
	ctx := context.Background()
	m := &clusterv1.Machine{
		ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: name, Labels: map[string]string{clusterv1.ClusterNameLabel: clusterID}},
		Spec: clusterv1.MachineSpec{ClusterName: clusterID, FailureDomain: "shard-a",
			Bootstrap:         clusterv1.Bootstrap{ConfigRef: bootstrapConfigRef(name), DataSecretName: secret},
			InfrastructureRef: clusterv1.ContractVersionedObjectReference{APIGroup: infrav1.GroupVersion.Group, Kind: "NstanceMachine", Name: name}},
	}
	require.NoError(t, env.Client.Create(ctx, m))
	require.NoError(t, env.Client.Create(ctx, &infrav1.NstanceMachine{
		ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: name, Labels: map[string]string{clusterv1.ClusterNameLabel: clusterID},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: clusterv1.GroupVersion.String(), Kind: "Machine", Name: name, UID: m.UID}}},
		Spec: infrav1.NstanceMachineSpec{Group: group},
	}))
}

// bootstrapConfigRef names a bootstrap provider's config, as a Machine
// waiting for its data carries one (no bootstrap provider runs here: the
// tests play it by setting dataSecretName).
func bootstrapConfigRef(name string) clusterv1.ContractVersionedObjectReference {
	return clusterv1.ContractVersionedObjectReference{APIGroup: "bootstrap.cluster.x-k8s.io", Kind: "KubeadmConfig", Name: name}
}

// createPoolBootstrap is createPool whose MachinePool template names no
// bootstrap data Secret yet (dataSecretName nil).
func (f *fixture) createPoolBootstrap(t testing.TB, name string, replicas int32, shards ...string) {
	t.Helper()
	ctx := context.Background()
	require.NoError(t, env.Client.Create(ctx, &infrav1.NstanceMachinePool{
		ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: name},
		Spec: infrav1.NstanceMachinePoolSpec{Group: name, Shards: shards, Template: "worker",
			DrainTimeout: &metav1.Duration{Duration: 100 * time.Millisecond}},
	}))
	require.NoError(t, env.Client.Create(ctx, &clusterv1.MachinePool{
		ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: name},
		Spec: clusterv1.MachinePoolSpec{
			ClusterName: clusterID, Replicas: ptr.To(replicas),
			Template: clusterv1.MachineTemplateSpec{Spec: clusterv1.MachineSpec{
				ClusterName: clusterID,
				Bootstrap:   clusterv1.Bootstrap{ConfigRef: bootstrapConfigRef(name)},
				InfrastructureRef: clusterv1.ContractVersionedObjectReference{
					APIGroup: infrav1.GroupVersion.Group, Kind: "NstanceMachinePool", Name: name,
				},
			}},
		},
	}))
}

func TestMachinePoolBootstrapData(t *testing.T) {
	f := newFixture(t, "shard-a", "shard-b")
	f.putNonce(t)
	rec := startRecorded(t, f)
	ctx := context.Background()

	// The pool's MachinePool names no bootstrap data Secret yet.
	f.createPoolBootstrap(t, "bp", 2, "shard-a", "shard-b")
	require.Eventually(t, func() bool {
		p, ok := get(t, f.ns, "bp", &infrav1.NstanceMachinePool{})
		c := conditions.Get(p, infrav1.ReadyCondition)
		return ok && c != nil && c.Reason == infrav1.WaitingForBootstrapDataReason
	}, waitLong, tick)
	time.Sleep(time.Second)
	require.Empty(t, rec.upsertsOf("bp"), "no group is created before the bootstrap data exists")
	var sgs infrav1.NstanceShardGroupList
	require.NoError(t, env.Client.List(ctx, &sgs, client.InNamespace(f.ns), client.MatchingLabels{infrav1.GroupLabel: "bp"}))
	require.Empty(t, sgs.Items)

	v1 := []byte("#cloud-config\nwrite_files: [{path: /etc/v, content: one}]\n")
	f.bootstrapSecret(t, "bp-bootstrap-1", map[string][]byte{"value": v1})
	setPoolSecret(t, f.ns, "bp", ptr.To("bp-bootstrap-1"))
	require.Eventually(t, func() bool { return rec.upsertedWith("bp", v1, userdata.FormatCloudConfig) }, waitLong, tick)
	f.waitGroupOnShards(t, "bp", "shard-a", "shard-b")
	requireServerHash(t, f, "bp", userdata.Hash(v1))

	// The bootstrap provider writes a new Secret: the group is upserted
	// with the new bytes (which makes the server roll its instances).
	v2 := []byte(`{"ignition":{"version":"3.4.0"}}`)
	f.bootstrapSecret(t, "bp-bootstrap-2", map[string][]byte{"value": v2, "format": []byte("ignition")})
	setPoolSecret(t, f.ns, "bp", ptr.To("bp-bootstrap-2"))
	require.Eventually(t, func() bool { return rec.upsertedWith("bp", v2, userdata.FormatIgnition) }, waitLong, tick)
	for _, s := range []string{"shard-a", "shard-b"} {
		require.Eventually(t, func() bool {
			sg, ok := get(t, f.ns, infrav1.ShardGroupName("bp", s), &infrav1.NstanceShardGroup{})
			return ok && sg.Spec.BootstrapDataSecretName == "bp-bootstrap-2"
		}, waitLong, tick)
	}
	requireServerHash(t, f, "bp", userdata.Hash(v2))
	// Two shards, two versions: the server's hash settles each, so there
	// is no upsert loop (before the server reported it: 26 calls in 2 s).
	require.LessOrEqual(t, len(rec.upsertsOf("bp")), 8, "UpsertGroup calls for bp")

	// A Secret without "value": ConfigValid false and a Warning Event on
	// each shard group; the servers keep the group as it was.
	f.bootstrapSecret(t, "bp-bootstrap-3", map[string][]byte{"format": []byte("cloud-config")})
	setPoolSecret(t, f.ns, "bp", ptr.To("bp-bootstrap-3"))
	sgName := infrav1.ShardGroupName("bp", "shard-a")
	require.Eventually(t, func() bool {
		sg, ok := get(t, f.ns, sgName, &infrav1.NstanceShardGroup{})
		c := conditions.Get(sg, infrav1.ConfigValidCondition)
		return ok && c != nil && c.Status == metav1.ConditionFalse && c.Reason == infrav1.BootstrapDataSecretInvalidReason
	}, waitLong, tick)
	require.Eventually(t, func() bool {
		return len(f.events(t, "NstanceShardGroup", sgName, infrav1.BootstrapDataSecretInvalidReason)) > 0
	}, waitLong, tick)
	require.Contains(t, f.events(t, "NstanceShardGroup", sgName, infrav1.BootstrapDataSecretInvalidReason)[0], "bp-bootstrap-3")
	for _, r := range rec.upsertsOf("bp") {
		require.NotEmpty(t, r.GetGroup().GetUserData(), "no upsert ever dropped the data")
	}
	require.Equal(t, uint32(1), f.shards["shard-a"].group(t, "bp").GetSpec().GetSize(), "the group keeps running")

	// Data above the server's limit: ConfigValid false BootstrapDataRejected
	// and a Warning Event naming the group and the Secret.
	f.bootstrapSecret(t, "bp-bootstrap-big", map[string][]byte{"value": bytes.Repeat([]byte("#"), maxUserData+1)})
	setPoolSecret(t, f.ns, "bp", ptr.To("bp-bootstrap-big"))
	require.Eventually(t, func() bool {
		sg, ok := get(t, f.ns, sgName, &infrav1.NstanceShardGroup{})
		c := conditions.Get(sg, infrav1.ConfigValidCondition)
		return ok && c != nil && c.Reason == infrav1.BootstrapDataRejectedReason
	}, waitLong, tick)
	require.Eventually(t, func() bool {
		return len(f.events(t, "NstanceShardGroup", sgName, infrav1.BootstrapDataRejectedReason)) > 0
	}, waitLong, tick)
	note := f.events(t, "NstanceShardGroup", sgName, infrav1.BootstrapDataRejectedReason)[0]
	require.Contains(t, note, "group bp")
	require.Contains(t, note, "bp-bootstrap-big")
	require.Eventually(t, func() bool {
		p, _ := get(t, f.ns, "bp", &infrav1.NstanceMachinePool{})
		c := conditions.Get(p, infrav1.ReadyCondition)
		return c != nil && c.Status == metav1.ConditionFalse && strings.Contains(c.Message, infrav1.BootstrapDataRejectedReason)
	}, waitLong, tick, "the pool's Ready condition names the refusal")
}

// setPoolSecret sets the MachinePool template's bootstrap dataSecretName.
func setPoolSecret(t testing.TB, ns, name string, secret *string) {
	t.Helper()
	require.Eventually(t, func() bool {
		var mp clusterv1.MachinePool
		if err := env.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, &mp); err != nil {
			return false
		}
		mp.Spec.Template.Spec.Bootstrap.DataSecretName = secret
		return env.Client.Update(context.Background(), &mp) == nil
	}, 10*time.Second, tick)
}

// requireServerHash checks that every shard of the group holds the data
// whose hash is want (GroupStatus.user_data_sha256).
func requireServerHash(t *testing.T, f *fixture, group, want string) {
	t.Helper()
	for id, s := range f.shards {
		require.Eventually(t, func() bool { return s.group(t, group).GetUserDataSha256() == want }, waitLong, tick, "shard %s", id)
	}
}
