package attack

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"

	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

// probeGroup and probeInstance are ids no one owns: a call that gets through
// with a stolen identity changes nothing that matters.
const (
	probeGroup    = "attack-probe"
	probeInstance = "attack-probe-00000000"
)

// recvFirst opens a server stream and waits for its first message or error.
func recvFirst[T any](s interface{ Recv() (T, error) }, err error) error {
	if err != nil {
		return err
	}
	_, err = s.Recv()
	return err
}

// operatorCalls makes every Operator RPC and watch once over conn and
// returns each call's error by method name. Each call has its own deadline
// (a watch that is accepted but quiet ends in DeadlineExceeded, which is not
// a refusal).
func operatorCalls(ctx context.Context, conn *grpc.ClientConn, perCall time.Duration) map[string]error {
	c := nstancev1.NewOperatorServiceClient(conn)
	calls := map[string]func(context.Context) error{}
	calls["GetConfigStatus"] = func(ctx context.Context) error {
		_, err := c.GetConfigStatus(ctx, &nstancev1.GetConfigStatusRequest{})
		return err
	}
	calls["RefreshConfig"] = func(ctx context.Context) error {
		_, err := c.RefreshConfig(ctx, &nstancev1.RefreshConfigRequest{})
		return err
	}
	calls["ListGroups"] = func(ctx context.Context) error {
		_, err := c.ListGroups(ctx, &nstancev1.ListGroupsRequest{})
		return err
	}
	calls["UpsertGroup"] = func(ctx context.Context) error {
		// An invalid template: even a call that got through creates nothing.
		_, err := c.UpsertGroup(ctx, &nstancev1.UpsertGroupRequest{Group: &nstancev1.GroupSpec{GroupId: probeGroup, Template: "no-such-template"}})
		return err
	}
	calls["DeleteGroup"] = func(ctx context.Context) error {
		_, err := c.DeleteGroup(ctx, &nstancev1.DeleteGroupRequest{GroupId: probeGroup})
		return err
	}
	calls["CreateInstance"] = func(ctx context.Context) error {
		_, err := c.CreateInstance(ctx, &nstancev1.CreateInstanceRequest{Template: "no-such-template"})
		return err
	}
	calls["DeleteInstance"] = func(ctx context.Context) error {
		_, err := c.DeleteInstance(ctx, &nstancev1.DeleteInstanceRequest{InstanceId: probeInstance})
		return err
	}
	calls["GetInstanceStatus"] = func(ctx context.Context) error {
		_, err := c.GetInstanceStatus(ctx, &nstancev1.GetInstanceStatusRequest{Lookup: &nstancev1.GetInstanceStatusRequest_InstanceId{InstanceId: probeInstance}})
		return err
	}
	calls["ListInstances"] = func(ctx context.Context) error {
		_, err := c.ListInstances(ctx, &nstancev1.ListInstancesRequest{})
		return err
	}
	calls["AcknowledgeDrained"] = func(ctx context.Context) error {
		_, err := c.AcknowledgeDrained(ctx, &nstancev1.AcknowledgeDrainedRequest{InstanceId: probeInstance})
		return err
	}
	calls["WatchGroups"] = func(ctx context.Context) error {
		s, err := c.WatchGroups(ctx, &nstancev1.WatchGroupsRequest{})
		return recvFirst[*nstancev1.GroupEvent](s, err)
	}
	calls["WatchInstances"] = func(ctx context.Context) error {
		s, err := c.WatchInstances(ctx, &nstancev1.WatchInstancesRequest{})
		return recvFirst[*nstancev1.InstanceEvent](s, err)
	}
	calls["WatchErrors"] = func(ctx context.Context) error {
		s, err := c.WatchErrors(ctx, &nstancev1.WatchErrorsRequest{})
		return recvFirst[*nstancev1.ErrorEvent](s, err)
	}
	calls["RenewCertificate"] = func(ctx context.Context) error {
		_, err := c.RenewCertificate(ctx, &nstancev1.RenewCertificateRequest{PublicKeyPem: "not a key"})
		return err
	}
	calls["DescribeInstanceType"] = func(ctx context.Context) error {
		_, err := c.DescribeInstanceType(ctx, &nstancev1.DescribeInstanceTypeRequest{InstanceType: "attack-probe-type"})
		return err
	}
	return runAll(ctx, calls, perCall)
}

// agentCalls makes every Agent RPC and stream once over conn.
func agentCalls(ctx context.Context, conn *grpc.ClientConn, perCall time.Duration) map[string]error {
	c := nstancev1.NewAgentServiceClient(conn)
	calls := map[string]func(context.Context) error{}
	calls["KeyGenRequests"] = func(ctx context.Context) error {
		s, err := c.KeyGenRequests(ctx, &nstancev1.KeyGenRequestsRequest{})
		return recvFirst[*nstancev1.KeyGenRequest](s, err)
	}
	calls["SubmitPublicKeys"] = func(ctx context.Context) error {
		_, err := c.SubmitPublicKeys(ctx, &nstancev1.SubmitPublicKeysRequest{})
		return err
	}
	calls["ReceiveFiles"] = func(ctx context.Context) error {
		s, err := c.ReceiveFiles(ctx, &nstancev1.ReceiveFilesRequest{})
		return recvFirst[*nstancev1.FileDelivery](s, err)
	}
	calls["ReportHealth"] = func(ctx context.Context) error {
		s, err := c.ReportHealth(ctx)
		if err != nil {
			return err
		}
		if err := s.Send(&nstancev1.HealthReport{}); err != nil {
			_, err = s.CloseAndRecv()
			return err
		}
		_, err = s.CloseAndRecv()
		return err
	}
	return runAll(ctx, calls, perCall)
}

// runAll makes the calls concurrently, each with its own deadline, and
// returns their errors by name.
func runAll(ctx context.Context, calls map[string]func(context.Context) error, perCall time.Duration) map[string]error {
	out := make(map[string]error, len(calls))
	var mu sync.Mutex
	var wg sync.WaitGroup
	for name, fn := range calls {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cctx, cancel := context.WithTimeout(ctx, perCall)
			defer cancel()
			err := fn(cctx)
			mu.Lock()
			out[name] = err
			mu.Unlock()
		}()
	}
	wg.Wait()
	return out
}

// expectAll checks every call's error with ok and lists the calls that did
// not pass, with their errors.
func expectAll(calls map[string]error, ok func(error) bool, what string) error {
	var bad []string
	for name, err := range calls {
		if !ok(err) {
			bad = append(bad, fmt.Sprintf("%s: %v", name, err))
		}
	}
	if len(bad) == 0 {
		return nil
	}
	sort.Strings(bad)
	return fmt.Errorf("%s: %s", what, strings.Join(bad, "; "))
}
