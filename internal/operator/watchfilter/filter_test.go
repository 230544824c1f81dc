package watchfilter

import (
	"testing"

	"github.com/go-logr/logr"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/event"

	infrav1 "github.com/nstance-dev/nstance/api/v1beta1"
)

func pool(labels map[string]string) *infrav1.NstanceMachinePool {
	return &infrav1.NstanceMachinePool{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns", Labels: labels}}
}

func TestMatches(t *testing.T) {
	cases := []struct {
		name   string
		filter Filter
		labels map[string]string
		want   bool
	}{
		{"no filter, no label", "", nil, true},
		{"no filter, any label", "", map[string]string{Label: "other"}, true},
		{"filter, no label", "tenant-a", nil, false},
		{"filter, other value", "tenant-a", map[string]string{Label: "tenant-b"}, false},
		{"filter, same value", "tenant-a", map[string]string{Label: "tenant-a"}, true},
		{"filter, empty value", "tenant-a", map[string]string{Label: ""}, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			assert.Equal(t, c.want, c.filter.Matches(pool(c.labels)))
		})
	}
}

func TestStamp(t *testing.T) {
	p := pool(nil)
	Filter("").Stamp(p)
	assert.Nil(t, p.Labels, "no filter adds no label")

	p = pool(map[string]string{"keep": "me"})
	Filter("tenant-a").Stamp(p)
	assert.Equal(t, map[string]string{"keep": "me", Label: "tenant-a"}, p.Labels)
	assert.True(t, Filter("tenant-a").Matches(p), "a stamped object is the stamping operator's")
	assert.False(t, Filter("tenant-b").Matches(p))
}

func TestInherit(t *testing.T) {
	child := pool(nil)
	Inherit(pool(nil), child)
	assert.Nil(t, child.Labels, "an unlabelled parent passes nothing on")
	Inherit(pool(map[string]string{Label: "tenant-a", "other": "x"}), child)
	assert.Equal(t, map[string]string{Label: "tenant-a"}, child.Labels, "only the filter label is inherited")
}

func TestValidate(t *testing.T) {
	require.NoError(t, Filter("").Validate())
	require.NoError(t, Filter("tenant-a.v1").Validate())
	require.Error(t, Filter("not a label value").Validate())
	require.Error(t, Filter("-leading").Validate())
}

func TestForPredicate(t *testing.T) {
	scheme := runtime.NewScheme()
	require.NoError(t, infrav1.AddToScheme(scheme))
	p := Filter("tenant-a").Predicate(scheme, logr.Discard())
	assert.True(t, p.Create(event.CreateEvent{Object: pool(map[string]string{Label: "tenant-a"})}))
	assert.False(t, p.Create(event.CreateEvent{Object: pool(nil)}))

	all := Filter("").Predicate(scheme, logr.Discard())
	assert.True(t, all.Create(event.CreateEvent{Object: pool(nil)}))
}
