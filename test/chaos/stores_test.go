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
// On Versity Gateway the two servers start one after the other: its posix
// backend removes a directory left empty by a DELETE, and a PUT racing into
// that directory fails with 409 ExistingObjectIsDirectory. Two servers
// starting at once race so with their start-up probes (each writes and
// deletes shard/<shard>/probe/<id>-<incarnation>), and the one that loses
// exits refusing to run (seen in 1 of 6 runs; docs/storage-compat.md).
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
				direct: srv.Store(t, bucket), oneByOne: k.Name == s3servers.Versity.Name}), storeRuns)
		})
	}
}
