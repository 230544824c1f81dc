package chaos

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nstance-dev/nstance/internal/testing/gcsemu"
	"github.com/nstance-dev/nstance/internal/testing/s3servers"
	"github.com/nstance-dev/nstance/pkg/objstore/gcsstore"
)

// storeRuns is how many handovers each store gets.
const storeRuns = 2

// TestLeaderCutOffFromOtherStores is TestLeaderCutOffFromStorage on object
// stores we did not write (docs/storage-compat.md): two nstance-server
// processes on a fresh bucket, each reaching the store through its own
// cutting proxy; the leader is cut off twice, alternating, and the
// handovers must show no overlap. fake-gcs-server (storage kind gcs) always
// runs, Versity Gateway when its build is cached, SeaweedFS and MinIO in
// `make compat` (s3servers.Gate; each subtest says why it skips).
//
// Both servers start at once on every store. On Versity Gateway that once
// made one exit at start-up: its posix backend removes a directory a DELETE
// left empty, and the other server's probe PUT racing into it got 409
// ExistingObjectIsDirectory, which s3store read as a failed precondition.
// s3store now tries such a PUT again (pkg/objstore/s3store TestConflictCodes).
func TestLeaderCutOffFromOtherStores(t *testing.T) {
	t.Run("fake-gcs-server", func(t *testing.T) {
		emu := gcsemu.Start(t)
		bucket := emu.NewBucket(t)
		direct, err := gcsstore.NewWithClient(emu.Client(t), bucket, "")
		require.NoError(t, err)
		cutOffRuns(t, newStackOn(t, 2, leaseConfig(), &objects{addr: emu.Addr, bucket: bucket, direct: direct,
			env: func(endpoint string) []string {
				return []string{"NSTANCE_STORAGE=gcs", "STORAGE_EMULATOR_HOST=" + strings.TrimPrefix(endpoint, "http://")}
			}}), storeRuns)
	})
	for _, k := range s3servers.All {
		t.Run(k.Name, func(t *testing.T) {
			srv := k.Run(t)
			bucket := srv.NewBucket(t)
			cutOffRuns(t, newStackOn(t, 2, leaseConfig(), &objects{addr: srv.Addr, bucket: bucket, env: srv.Env,
				direct: srv.Store(t, bucket)}), storeRuns)
		})
	}
}
