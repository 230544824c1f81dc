package machinecleanup

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	k8stypes "k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/events"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	infrav1 "github.com/nstance-dev/nstance/api/v1beta1"
)

const ns = "default"

func newScheme(t *testing.T) *runtime.Scheme {
	t.Helper()
	s := runtime.NewScheme()
	require.NoError(t, clientgoscheme.AddToScheme(s))
	require.NoError(t, clusterv1.AddToScheme(s))
	require.NoError(t, infrav1.AddToScheme(s))
	return s
}

func capiMachine(name, uid string, annotations map[string]string) *clusterv1.Machine {
	return &clusterv1.Machine{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: k8stypes.UID("uid-" + uid), Annotations: annotations}}
}

func nstanceMachine(owners ...metav1.OwnerReference) *infrav1.NstanceMachine {
	return &infrav1.NstanceMachine{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "nm", OwnerReferences: owners}}
}

func ownedByMachine(name, uid string) metav1.OwnerReference {
	return metav1.OwnerReference{APIVersion: clusterv1.GroupVersion.String(), Kind: "Machine", Name: name, UID: k8stypes.UID("uid-" + uid)}
}

type fixture struct {
	cl  client.WithWatch
	rec *events.FakeRecorder
	c   *Cleaner
}

func newFixture(t *testing.T, funcs *interceptor.Funcs, objs ...client.Object) *fixture {
	t.Helper()
	cl := fake.NewClientBuilder().WithScheme(newScheme(t)).WithObjects(objs...).Build()
	rec := events.NewFakeRecorder(8)
	// The Cleaner goes through funcs; the test checks the stored objects
	// through cl.
	var through client.Client = cl
	if funcs != nil {
		through = interceptor.NewClient(cl, *funcs)
	}
	return &fixture{cl: cl, rec: rec, c: &Cleaner{Client: through, Recorder: rec}}
}

// stored returns the NstanceMachine nm as stored, nil when gone.
func (f *fixture) stored(t *testing.T) *infrav1.NstanceMachine {
	t.Helper()
	var m infrav1.NstanceMachine
	err := f.cl.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "nm"}, &m)
	if apierrors.IsNotFound(err) {
		return nil
	}
	require.NoError(t, err)
	return &m
}

func (f *fixture) machine(t *testing.T, name string) *clusterv1.Machine {
	t.Helper()
	var m clusterv1.Machine
	err := f.cl.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, &m)
	if apierrors.IsNotFound(err) {
		return nil
	}
	require.NoError(t, err)
	return &m
}

func (f *fixture) events() []string {
	var out []string
	for {
		select {
		case e := <-f.rec.Events:
			out = append(out, e)
		default:
			return out
		}
	}
}

func TestRemoveWithoutMachineDeletesNstanceMachine(t *testing.T) {
	nm := nstanceMachine()
	f := newFixture(t, nil, nm)
	require.NoError(t, f.c.Remove(context.Background(), f.stored(t), "s1", "i-1"))
	require.Nil(t, f.stored(t))
	require.Equal(t, []string{"Normal InstanceDeleted instance i-1 was deleted on shard s1; deleting NstanceMachine"}, f.events())
}

func TestRemoveMarksAndDeletesMachine(t *testing.T) {
	// The owning Machine is deleted rather than the NstanceMachine (core
	// Cluster API deletes that and the Node).
	var patched *clusterv1.Machine
	f := newFixture(t, &interceptor.Funcs{
		Patch: func(ctx context.Context, c client.WithWatch, obj client.Object, p client.Patch, opts ...client.PatchOption) error {
			if err := c.Patch(ctx, obj, p, opts...); err != nil {
				return err
			}
			patched = obj.(*clusterv1.Machine).DeepCopy()
			return nil
		},
	}, nstanceMachine(ownedByMachine("m1", "1")), capiMachine("m1", "1", map[string]string{"keep": "me"}))
	require.NoError(t, f.c.Remove(context.Background(), f.stored(t), "s1", "i-1"))
	require.NotNil(t, patched, "the Machine is marked before it is deleted")
	why := "instance i-1 was deleted on shard s1"
	require.Equal(t, map[string]string{
		"keep":                                  "me",
		clusterv1.ExcludeNodeDrainingAnnotation: why,
		clusterv1.ExcludeWaitForNodeVolumeDetachAnnotation: why,
	}, patched.Annotations)
	require.Nil(t, f.machine(t, "m1"), "the Machine is deleted")
	require.NotNil(t, f.stored(t), "the NstanceMachine is left to Cluster API")
	require.Equal(t, []string{"Normal InstanceDeleted instance i-1 was deleted on shard s1; deleting Machine m1"}, f.events())
}

func TestRemoveMachineAlreadyMarkedIsNotPatched(t *testing.T) {
	marked := map[string]string{clusterv1.ExcludeNodeDrainingAnnotation: "x", clusterv1.ExcludeWaitForNodeVolumeDetachAnnotation: "y"}
	patches := 0
	f := newFixture(t, &interceptor.Funcs{
		Patch: func(ctx context.Context, c client.WithWatch, obj client.Object, p client.Patch, opts ...client.PatchOption) error {
			patches++
			return c.Patch(ctx, obj, p, opts...)
		},
	}, nstanceMachine(ownedByMachine("m1", "1")), capiMachine("m1", "1", marked))
	require.NoError(t, f.c.Remove(context.Background(), f.stored(t), "s1", "i-1"))
	require.Zero(t, patches)
	require.Nil(t, f.machine(t, "m1"))
}

func TestRemoveLeavesOtherMachinesAlone(t *testing.T) {
	tests := []struct {
		name    string
		objects []client.Object
	}{
		{"the Machine is gone", []client.Object{nstanceMachine(ownedByMachine("m1", "1"))}},
		{"another Machine took the name", []client.Object{nstanceMachine(ownedByMachine("m1", "1")), capiMachine("m1", "2", nil)}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixture(t, nil, tt.objects...)
			require.NoError(t, f.c.Remove(context.Background(), f.stored(t), "s1", "i-1"))
			require.NotNil(t, f.stored(t), "the NstanceMachine stays (its Machine is not ours to delete)")
			if m := f.machine(t, "m1"); m != nil {
				require.Empty(t, m.Annotations, "another Machine is not marked")
			}
			require.Empty(t, f.events())
		})
	}
}

func TestRemoveNothingToDo(t *testing.T) {
	f := newFixture(t, nil)
	require.NoError(t, f.c.Remove(context.Background(), nil, "s1", "i-1"), "no NstanceMachine")

	deleting := nstanceMachine()
	deleting.DeletionTimestamp = &metav1.Time{Time: time.Unix(1, 0)}
	deleting.Finalizers = []string{"example.com/hold"}
	f = newFixture(t, nil, deleting)
	require.NoError(t, f.c.Remove(context.Background(), f.stored(t), "s1", "i-1"))
	require.NotNil(t, f.stored(t), "an NstanceMachine being deleted is left to that deletion")
	require.Empty(t, f.events())
}

func TestRemoveMachineLookupFails(t *testing.T) {
	f := newFixture(t, &interceptor.Funcs{
		Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
			if _, ok := obj.(*clusterv1.Machine); ok {
				return apierrors.NewForbidden(schema.GroupResource{Group: clusterv1.GroupVersion.Group, Resource: "machines"}, key.Name, errors.New("no"))
			}
			return c.Get(ctx, key, obj, opts...)
		},
	}, nstanceMachine(ownedByMachine("m1", "1")), capiMachine("m1", "1", nil))
	err := f.c.Remove(context.Background(), f.stored(t), "s1", "i-1")
	require.ErrorContains(t, err, "mark Machine m1")
	require.True(t, apierrors.IsForbidden(err))
	require.NotNil(t, f.machine(t, "m1"))
	require.NotNil(t, f.stored(t))
}

func TestOwningMachine(t *testing.T) {
	tests := []struct {
		name   string
		owners []metav1.OwnerReference
		want   string
	}{
		{"none", nil, ""},
		{"a Machine", []metav1.OwnerReference{ownedByMachine("m1", "1")}, "m1"},
		{"a Machine of an older API version", []metav1.OwnerReference{{APIVersion: "cluster.x-k8s.io/v1beta1", Kind: "Machine", Name: "old"}}, "old"},
		{"a Machine of another group", []metav1.OwnerReference{{APIVersion: "example.com/v1", Kind: "Machine", Name: "x"}}, ""},
		{"a MachinePool, then a Machine", []metav1.OwnerReference{
			{APIVersion: clusterv1.GroupVersion.String(), Kind: "MachinePool", Name: "p"}, ownedByMachine("m2", "2"),
		}, "m2"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ref, ok := owningMachine(nstanceMachine(tt.owners...))
			require.Equal(t, tt.want != "", ok)
			require.Equal(t, tt.want, ref.Name)
		})
	}
}

func TestRemoveReadsTheMachineThroughReader(t *testing.T) {
	f := newFixture(t, nil, nstanceMachine(ownedByMachine("m1", "1")), capiMachine("m1", "1", nil))
	// The (uncached) Reader does not see the Machine the Client has: the
	// Machine is taken for gone and neither marked nor deleted.
	f.c.Reader = fake.NewClientBuilder().WithScheme(newScheme(t)).Build()
	require.NoError(t, f.c.Remove(context.Background(), f.stored(t), "s1", "i-1"))
	m := f.machine(t, "m1")
	require.NotNil(t, m)
	require.Empty(t, m.Annotations)
	require.Empty(t, f.events())
}
