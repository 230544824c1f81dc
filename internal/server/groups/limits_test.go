package groups_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nstance-dev/nstance/internal/layout"
	"github.com/nstance-dev/nstance/internal/server/groups"
	"github.com/nstance-dev/nstance/pkg/objstore/memstore"
)

func reasons(fes []groups.FieldError) string {
	var b strings.Builder
	for _, fe := range fes {
		fmt.Fprintf(&b, "%s: %s\n", fe.Key, fe.Reason)
	}
	return b.String()
}

func TestCheckMapsLengths(t *testing.T) {
	cfg := testConfig()
	l := &cfg.Shard.Limits
	l.MaxVarKeyBytes, l.MaxVarValueBytes, l.MaxLabelKeyBytes, l.MaxLabelValueBytes = 8, 16, 10, 20

	// At the limits: accepted.
	require.Empty(t, groups.CheckMaps(cfg, map[string]string{"abcdefgh": strings.Repeat("v", 16)},
		map[string]string{"abcdefghij": strings.Repeat("l", 20)}))

	for name, tc := range map[string]struct {
		vars, labels map[string]string
		key, want    string
	}{
		"var value": {vars: map[string]string{"blob": strings.Repeat("v", 17)}, key: "vars",
			want: `var "blob": value of 17 bytes, more than shard.limits.max_var_value_bytes (16)`},
		"var name": {vars: map[string]string{"abcdefghi": "x"}, key: "vars",
			want: `var name "abcdefghi"... of 9 bytes, more than shard.limits.max_var_key_bytes (8)`},
		"label value": {labels: map[string]string{"team": strings.Repeat("l", 21)}, key: "labels",
			want: `label "team": value of 21 bytes, more than shard.limits.max_label_value_bytes (20)`},
		"label key": {labels: map[string]string{"abcdefghijk": "x"}, key: "labels",
			want: `label name "abcdefghijk"... of 11 bytes, more than shard.limits.max_label_key_bytes (10)`},
	} {
		t.Run(name, func(t *testing.T) {
			fes := groups.CheckMaps(cfg, tc.vars, tc.labels)
			require.Len(t, fes, 1, reasons(fes))
			require.Equal(t, tc.key, fes[0].Key)
			require.Equal(t, tc.want, fes[0].Reason)
		})
	}

	// Many offenders: the first few are named, the rest counted.
	vars := map[string]string{}
	for i := range 9 {
		vars[fmt.Sprintf("v%d", i)] = strings.Repeat("x", 100)
	}
	fes := groups.CheckMaps(cfg, vars, nil)
	require.Len(t, fes, 6, reasons(fes))
	require.Contains(t, fes[0].Reason, `var "v0"`)
	require.Equal(t, "4 more vars too long", fes[5].Reason)

	// A key of megabytes is named by its first bytes only.
	fes = groups.CheckMaps(cfg, map[string]string{strings.Repeat("k", 1<<20): "x"}, nil)
	require.Len(t, fes, 1)
	require.Less(t, len(fes[0].Reason), 200)
	require.Contains(t, fes[0].Reason, "of 1048576 bytes")
}

func TestValidateRefusesLongValuesWithDefaults(t *testing.T) {
	cfg := testConfig()
	ok := groups.Spec{Template: "worker", Vars: map[string]string{"pem": strings.Repeat("p", 4<<10)}, Labels: map[string]string{"team": "a"}}
	require.Empty(t, groups.Validate(cfg, "acme", "web", ok))
	fes := groups.Validate(cfg, "acme", "web", groups.Spec{Template: "worker", Vars: map[string]string{"pem": strings.Repeat("p", 4<<10+1)}})
	require.Len(t, fes, 1, reasons(fes))
	require.Contains(t, fes[0].Reason, "shard.limits.max_var_value_bytes (4096)")
	fes = groups.Validate(cfg, "acme", "web", groups.Spec{Template: "worker", Labels: map[string]string{"d": strings.Repeat("d", 1025)}})
	require.Len(t, fes, 1, reasons(fes))
	require.Contains(t, fes[0].Reason, "shard.limits.max_label_value_bytes (1024)")
}

// TestUpsertWithinTenantBytes: a tenant's groups are refused beyond the
// byte quota, with nothing stored; another tenant is unaffected; a group
// may always be replaced by one no larger, even above a lowered quota.
func TestUpsertWithinTenantBytes(t *testing.T) {
	ctx := context.Background()
	store := memstore.New()
	r := groups.NewRegistry(store, layout.New(""), "s1")
	_, err := r.Load(ctx)
	require.NoError(t, err)
	spec := groups.Spec{Template: "worker", Vars: map[string]string{"blob": strings.Repeat("b", 1000)}}
	q := groups.Quota{Groups: 100, Bytes: 3500}
	for _, id := range []string{"g1", "g2", "g3"} {
		_, _, err := r.UpsertWithin(ctx, groups.Key{Tenant: "acme", ID: id}, spec, "", q)
		require.NoError(t, err, id)
	}
	_, _, err = r.UpsertWithin(ctx, groups.Key{Tenant: "acme", ID: "g4"}, spec, "", q)
	require.ErrorIs(t, err, groups.ErrQuota)
	require.ErrorContains(t, err, "group g4 of tenant acme takes")
	require.ErrorContains(t, err, "shard.limits.max_tenant_group_bytes (3500)")
	_, ok := r.Get(groups.Key{Tenant: "acme", ID: "g4"})
	require.False(t, ok)
	r2 := groups.NewRegistry(store, layout.New(""), "s1")
	_, err = r2.Load(ctx)
	require.NoError(t, err)
	require.Len(t, r2.List("acme"), 3, "nothing stored for the refused group")

	// Growing an existing group beyond the quota is refused too.
	bigger := groups.Spec{Template: "worker", Vars: map[string]string{"blob": strings.Repeat("b", 1500)}}
	_, _, err = r.UpsertWithin(ctx, groups.Key{Tenant: "acme", ID: "g1"}, bigger, "", q)
	require.ErrorIs(t, err, groups.ErrQuota)

	// Another tenant has its own quota.
	_, _, err = r.UpsertWithin(ctx, groups.Key{Tenant: "globex", ID: "g1"}, spec, "", q)
	require.NoError(t, err)

	// Lowered quota: the tenant is above it, yet may replace a group by one
	// no larger (and shrink), but not add.
	low := groups.Quota{Bytes: 2000}
	_, _, err = r.UpsertWithin(ctx, groups.Key{Tenant: "acme", ID: "g2"}, spec, "", low)
	require.NoError(t, err)
	_, _, err = r.UpsertWithin(ctx, groups.Key{Tenant: "acme", ID: "g3"}, groups.Spec{Template: "worker"}, "", low)
	require.NoError(t, err)
	_, _, err = r.UpsertWithin(ctx, groups.Key{Tenant: "acme", ID: "g5"}, groups.Spec{Template: "worker"}, "", low)
	require.ErrorIs(t, err, groups.ErrQuota)
}
