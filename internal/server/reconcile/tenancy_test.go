package reconcile_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nstance-dev/nstance/internal/server/tenantops"
	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

// Templates are used only by the tenants they list: UpsertGroup (new or
// moved group) and CreateInstance answer ErrDenied naming template and
// tenant, and a group whose template stopped listing its tenant creates
// nothing.
func TestTemplateTenants(t *testing.T) {
	b := newShardConfig(t)
	w := b.c.Templates["worker"]
	w.Tenants = []string{"t"}
	b.c.Templates["worker"] = w
	other := w
	other.Tenants = []string{"other"}
	b.c.Templates["other-worker"] = other
	cfg := b.build(t)
	s := newShard(t, cfg, shardOptions{})
	ctx := context.Background()

	_, _, err := s.ops.UpsertGroup(ctx, "other", &nstancev1.GroupSpec{GroupId: "g", Template: "worker", Size: 1}, "")
	require.ErrorIs(t, err, tenantops.ErrDenied)
	require.ErrorContains(t, err, `template "worker" is not available to tenant "other"`)
	require.Empty(t, s.ops.ListGroups("other"))
	_, err = s.ops.CreateInstance(ctx, "other", tenantops.CreateInstanceRequest{Template: "worker"})
	require.ErrorIs(t, err, tenantops.ErrDenied)
	require.Empty(t, s.insts.ListGroup("other", ""))

	// A group of t cannot move to the other tenant's template.
	s.upsert(t, "g", 1, 0)
	require.Len(t, s.ids("g"), 1)
	_, _, err = s.ops.UpsertGroup(ctx, "t", &nstancev1.GroupSpec{GroupId: "g", Template: "other-worker", Size: 1}, "")
	require.ErrorIs(t, err, tenantops.ErrDenied)
	require.Equal(t, "worker", s.group(t, "g").Spec.Template)

	// The config takes worker away from t: the group grows no more.
	_, _, err = s.ops.UpsertGroup(ctx, "t", &nstancev1.GroupSpec{GroupId: "g", Template: "worker", Size: 3}, "")
	require.NoError(t, err)
	w.Tenants = []string{"other"}
	cfg.Templates["worker"] = w
	require.NoError(t, cfg.Validate())
	s.run(t)
	require.Len(t, s.ids("g"), 1, "no instance from a template no longer listing the tenant")
}
