package aws_test

import (
	"context"
	"testing"
	"time"

	awssdk "github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/aws-sdk-go-v2/service/ec2/types"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/nstance-dev/nstance/internal/server/provider/aws"
	"github.com/nstance-dev/nstance/internal/server/provider/aws/fake"
)

// launch starts a running instance in the fake (a shard server's machine).
func launch(t *testing.T, f *fake.EC2) string {
	t.Helper()
	out, err := f.RunInstances(context.Background(), &ec2.RunInstancesInput{ImageId: awssdk.String("ami-server"),
		MinCount: awssdk.Int32(1), MaxCount: awssdk.Int32(1), SubnetId: awssdk.String("subnet-a")})
	require.NoError(t, err)
	id := *out.Instances[0].InstanceId
	require.NoError(t, f.SetState(id, types.InstanceStateNameRunning))
	return id
}

func holder(f *fake.EC2, eni, instance string) *aws.ENI {
	return &aws.ENI{API: f, NetworkInterfaceID: eni, InstanceID: instance,
		Backoff: wait.Backoff{Duration: time.Millisecond, Factor: 1.5, Cap: 10 * time.Millisecond}}
}

// TestENIMovesBetweenServersDuringFailover: server A leads and holds the
// shard's ENI; A dies without releasing it; B wins the election and takes
// the ENI (force-detaching it from A); A, back as a standby, releasing
// leaves B's attachment alone; B steps down and releases; A leads again.
func TestENIMovesBetweenServersDuringFailover(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	f := fake.New("subnet-a")
	f.SettleAfter = 2
	eni := f.AddNetworkInterface("subnet-a", "10.0.0.5")
	serverA, serverB := launch(t, f), launch(t, f)
	a, b := holder(f, eni, serverA), holder(f, eni, serverB)

	require.NoError(t, a.Acquire(ctx))
	at, status := f.AttachedTo(eni)
	require.Equal(t, serverA, at)
	require.Equal(t, types.AttachmentStatusAttached, status, "Acquire returns once EC2 reports it attached")
	require.NoError(t, a.Acquire(ctx), "acquiring again is a no-op")
	require.Equal(t, 1, f.Calls(fake.OpAttachNetworkInterface))

	// A crashes holding the ENI; B takes over, through throttling.
	f.Throttle(fake.OpDescribeNetworkInterfaces, 2)
	f.Throttle(fake.OpAttachNetworkInterface, 1)
	require.NoError(t, b.Acquire(ctx))
	at, status = f.AttachedTo(eni)
	require.Equal(t, serverB, at)
	require.Equal(t, types.AttachmentStatusAttached, status)
	require.GreaterOrEqual(t, f.Calls(fake.OpDetachNetworkInterface), 1, "the old holder was force-detached")

	// A (now a standby) releasing must not take the address from B.
	detaches := f.Calls(fake.OpDetachNetworkInterface)
	require.NoError(t, a.Release(ctx))
	at, _ = f.AttachedTo(eni)
	require.Equal(t, serverB, at)
	require.Equal(t, detaches, f.Calls(fake.OpDetachNetworkInterface))

	// B steps down cleanly; A leads again.
	require.NoError(t, b.Release(ctx))
	at, _ = f.AttachedTo(eni)
	require.Empty(t, at, "released and detached")
	require.NoError(t, a.Acquire(ctx))
	at, _ = f.AttachedTo(eni)
	require.Equal(t, serverA, at)
}

// TestENIHolderDies: the holder's instance is terminated, which detaches
// the ENI; the next leader attaches it without a detach.
func TestENIHolderTerminated(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	f := fake.New("subnet-a")
	eni := f.AddNetworkInterface("subnet-a", "10.0.0.5")
	serverA, serverB := launch(t, f), launch(t, f)
	require.NoError(t, holder(f, eni, serverA).Acquire(ctx))
	_, err := f.TerminateInstances(ctx, &ec2.TerminateInstancesInput{InstanceIds: []string{serverA}})
	require.NoError(t, err)
	require.NoError(t, holder(f, eni, serverB).Acquire(ctx))
	at, _ := f.AttachedTo(eni)
	require.Equal(t, serverB, at)
	require.Equal(t, 0, f.Calls(fake.OpDetachNetworkInterface))
}

func TestENIErrors(t *testing.T) {
	f := fake.New("subnet-a")
	eni := f.AddNetworkInterface("subnet-a", "10.0.0.5")
	server := launch(t, f)

	// A missing ENI or instance is a configuration error, not a wait.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err := holder(f, "eni-missing", server).Acquire(ctx)
	require.ErrorContains(t, err, "InvalidNetworkInterfaceID.NotFound")
	require.Equal(t, 1, f.Calls(fake.OpDescribeNetworkInterfaces), "no second look")
	err = holder(f, eni, "i-missing").Acquire(ctx)
	require.ErrorContains(t, err, "InvalidInstanceID.NotFound")
	require.Equal(t, 1, f.Calls(fake.OpAttachNetworkInterface), "no second attach")

	// Release is bounded by its context: a detach that never settles
	// returns when the step-down budget is spent.
	require.NoError(t, holder(f, eni, server).Acquire(ctx))
	f.SettleAfter = 1 << 30
	short, cancelShort := context.WithCancel(ctx)
	defer cancelShort()
	detaches := f.Calls(fake.OpDetachNetworkInterface)
	go func() {
		// The step-down budget ends once the detach was asked for.
		for f.Calls(fake.OpDetachNetworkInterface) == detaches && short.Err() == nil {
			time.Sleep(time.Millisecond)
		}
		cancelShort()
	}()
	err = holder(f, eni, server).Release(short)
	require.ErrorIs(t, err, context.Canceled)
	require.ErrorContains(t, err, "releasing")
	_, status := f.AttachedTo(eni)
	require.Equal(t, types.AttachmentStatusDetaching, status, "the detach was asked for")
}
