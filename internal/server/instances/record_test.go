package instances_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nstance-dev/nstance/internal/server/instances"
	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

// TestReplaced: only a group member deleted for a reason its group makes
// up for (the size is kept) has a successor; the wire form carries it.
func TestReplaced(t *testing.T) {
	for _, tc := range []struct {
		name   string
		rec    instances.Record
		expect bool
	}{
		{"running member", instances.Record{GroupID: "web"}, false},
		{"rotation", instances.Record{GroupID: "web", DeletionReason: nstancev1.DeletionReason_DELETION_REASON_ROTATION}, true},
		{"unhealthy", instances.Record{GroupID: "web", DeletionReason: nstancev1.DeletionReason_DELETION_REASON_UNHEALTHY}, true},
		{"spot", instances.Record{GroupID: "web", DeletionReason: nstancev1.DeletionReason_DELETION_REASON_SPOT_TERMINATION}, true},
		{"expiry", instances.Record{GroupID: "web", DeletionReason: nstancev1.DeletionReason_DELETION_REASON_EXPIRY}, true},
		{"deleted through the API", instances.Record{GroupID: "web", DeletionReason: nstancev1.DeletionReason_DELETION_REASON_ON_DEMAND_DELETE}, true},
		{"scale-down", instances.Record{GroupID: "web", DeletionReason: nstancev1.DeletionReason_DELETION_REASON_SCALE_DOWN}, false},
		{"group deleted", instances.Record{GroupID: "web", DeletionReason: nstancev1.DeletionReason_DELETION_REASON_GROUP_DELETED}, false},
		{"outside a group", instances.Record{DeletionReason: nstancev1.DeletionReason_DELETION_REASON_UNHEALTHY}, false},
		{"on demand in a group", instances.Record{GroupID: "web", ClientToken: "tok", DeletionReason: nstancev1.DeletionReason_DELETION_REASON_UNHEALTHY}, false},
		{"on demand without a token", instances.Record{GroupID: "web", OnDemand: true, DeletionReason: nstancev1.DeletionReason_DELETION_REASON_UNHEALTHY}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.expect, tc.rec.Replaced())
			require.Equal(t, tc.expect, tc.rec.Proto().GetReplaced())
		})
	}
}
