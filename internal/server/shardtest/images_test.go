package shardtest_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/ec2/types"
	"github.com/stretchr/testify/require"

	awssdk "github.com/aws/aws-sdk-go-v2/aws"

	"github.com/nstance-dev/nstance/internal/config"
	"github.com/nstance-dev/nstance/internal/server/provider"
	"github.com/nstance-dev/nstance/internal/server/provider/aws"
	"github.com/nstance-dev/nstance/internal/server/provider/aws/fake"
	"github.com/nstance-dev/nstance/internal/server/shardtest"
	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

const imagesOwner = "123456789012"

// liveImages returns the image of every live fake instance.
func liveImages(f *fake.EC2) []string {
	var out []string
	for _, i := range f.Instances() {
		if s := i.State.Name; s != types.InstanceStateNameShuttingDown && s != types.InstanceStateNameTerminated {
			out = append(out, awssdk.ToString(i.ImageId))
		}
	}
	return out
}

// TestImageLookupRollsGroup: a template names an image by lookup
// (image_name); the group of 3 is launched from the newest matching AMI.
// A newer AMI matching the filter makes every member drift and the group
// rolls with surge 1 (never more than 4 active members, each replaced
// once); a failed lookup keeps the image and raises an error event
// naming the group.
func TestImageLookupRollsGroup(t *testing.T) {
	ec2 := fake.New("test-subnet-a")
	t0 := time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)
	ec2.AddImage("ami-0000000000000old", "nstance-base-2026-11-01", imagesOwner, types.ArchitectureValuesX8664, t0)
	ec2.AddImage("ami-00000000000older", "nstance-base-2026-10-01", imagesOwner, types.ArchitectureValuesX8664, t0.AddDate(0, -1, 0))
	ec2.AddImage("ami-00000000000arm64", "nstance-base-2026-11-20", imagesOwner, types.ArchitectureValuesArm64, t0.AddDate(0, 0, 19))
	ec2.AddImage("ami-0000000000other", "nstance-base-2026-11-25", "999999999999", types.ArchitectureValuesX8664, t0.AddDate(0, 0, 24))

	o := aws.DefaultOptions()
	o.Images = map[string]aws.Image{"base": {Name: "nstance-base-*", Owners: []string{imagesOwner}, Architecture: "x86_64"}}
	doc := strings.Replace(shardtest.Config("test-cluster", "test-1", "mock"), `"subnet_pool": "default",`, `"subnet_pool": "default", "args": { "image_name": "base" },`, 1)
	cfg, err := config.Parse([]byte(doc))
	require.NoError(t, err)
	p := aws.New(ec2, *o, provider.Env{Config: func() *config.Config { return cfg }})
	sh := shardtest.Start(t, shardtest.Options{ConfigJSONC: doc, Provider: p})
	c := sh.Client(t, "acme")
	ctx := ctxT(t)
	we, err := c.WatchErrors(ctx, &nstancev1.WatchErrorsRequest{})
	require.NoError(t, err)
	_, err = we.Header()
	require.NoError(t, err)
	errs := collect(t, we.Recv)

	upsert(t, c, "web", 3, 100*time.Millisecond)
	waitGroup(t, c, "web", 3)
	require.Equal(t, []string{"ami-0000000000000old", "ami-0000000000000old", "ami-0000000000000old"}, liveImages(ec2))

	// Sample the group's active members while the new image rolls out.
	var mu sync.Mutex
	maxActive := 0
	sctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for sctx.Err() == nil {
			n := 0
			for _, r := range sh.Assembly.Instances.ListGroup("acme", "web") {
				if r.State.Active() {
					n++
				}
			}
			mu.Lock()
			maxActive = max(maxActive, n)
			mu.Unlock()
			time.Sleep(2 * time.Millisecond)
		}
	}()
	ec2.AddImage("ami-0000000000000new", "nstance-base-2026-11-26", imagesOwner, types.ArchitectureValuesX8664, t0.AddDate(0, 0, 25))
	sh.Assembly.Images.Refresh(ctx)
	require.Equal(t, map[string]string{"base": "ami-0000000000000new"}, sh.Assembly.Images.IDs())
	require.Eventually(t, func() bool {
		g := group(t, c, "web")
		live := liveImages(ec2)
		return g.GetUpToDateCount() == 3 && g.GetReadyCount() == 3 && len(live) == 3 &&
			live[0] == "ami-0000000000000new" && live[1] == live[0] && live[2] == live[0]
	}, 30*time.Second, 20*time.Millisecond, "the group never rolled to the new image: %v", liveImages(ec2))
	stop()
	wg.Wait()
	require.Equal(t, 4, maxActive, "the rollout surges by one active member, never more")
	require.Len(t, ec2.Instances(), 6, "each member replaced once")

	// A failed lookup keeps the image and tells the group's tenant.
	ec2.FailImages(1)
	sh.Assembly.Images.Refresh(ctx)
	ev := errs.next(t, 10*time.Second, func(e *nstancev1.ErrorEvent) bool { return strings.Contains(e.GetMessage(), `image "base"`) })
	require.Equal(t, "web", ev.GetGroupId())
	require.Contains(t, ev.GetMessage(), "lookup failed, keeping ami-0000000000000new")
	require.Contains(t, ev.GetMessage(), "UnauthorizedOperation")
	require.Equal(t, map[string]string{"base": "ami-0000000000000new"}, sh.Assembly.Images.IDs())
	g := group(t, c, "web")
	require.Equal(t, uint32(3), g.GetUpToDateCount())
	require.Len(t, ec2.Instances(), 6, "nothing rolled")
}
