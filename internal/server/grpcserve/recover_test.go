package grpcserve_test

import (
	"context"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/nstance-dev/nstance/internal/pki"
	"github.com/nstance-dev/nstance/internal/server/grpcserve"
	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

// panicky panics in GetConfigStatus and WatchGroups while boom is set and
// answers normally otherwise.
type panicky struct {
	nstancev1.UnimplementedOperatorServiceServer
	boom atomic.Bool
}

func (p *panicky) GetConfigStatus(context.Context, *nstancev1.GetConfigStatusRequest) (*nstancev1.GetConfigStatusResponse, error) {
	if p.boom.Load() {
		var m map[string]int
		m["nil map"]++ //nolint:staticcheck // a real runtime panic is the point
	}
	return &nstancev1.GetConfigStatusResponse{Shard: "s1"}, nil
}

func (p *panicky) WatchGroups(_ *nstancev1.WatchGroupsRequest, _ nstancev1.OperatorService_WatchGroupsServer) error {
	if p.boom.Load() {
		panic("stream handler exploded")
	}
	return nil
}

func TestHandlerPanicAnswersInternalAndServerKeepsServing(t *testing.T) {
	now := time.Now()
	ca, err := pki.GenerateCA("c1", 24*time.Hour, now)
	require.NoError(t, err)
	srvCert, err := ca.ServerKeyPair(pki.ServerIdentity{Shard: "s1", ServerID: "srv"}, []string{"127.0.0.1"}, time.Hour, now)
	require.NoError(t, err)
	var mu sync.Mutex
	var logged []string
	log := funcr.New(func(_, args string) { mu.Lock(); logged = append(logged, args); mu.Unlock() }, funcr.Options{})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	svc := &panicky{}
	svc.boom.Store(true)
	srv, err := grpcserve.Start(grpcserve.Config{ClusterID: "c1", ServerCert: srvCert, ClientCAs: ca.Pool(), Operator: svc, Log: log},
		grpcserve.Listeners{Operator: ln})
	require.NoError(t, err)
	t.Cleanup(srv.Stop)

	c := nstancev1.NewOperatorServiceClient(dial(t, ln.Addr().String(), ca, clientCert(t, ca, pki.RoleOperator, now)))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for i := 0; i < 3; i++ {
		_, err = c.GetConfigStatus(ctx, &nstancev1.GetConfigStatusRequest{})
		require.Equal(t, codes.Internal, status.Code(err), "%v", err)
		require.Equal(t, "internal error", status.Convert(err).Message(), "the panic value is not sent to the client")
		ws, err := c.WatchGroups(ctx, &nstancev1.WatchGroupsRequest{})
		require.NoError(t, err)
		_, err = ws.Recv()
		require.Equal(t, codes.Internal, status.Code(err), "%v", err)
	}
	mu.Lock()
	all := strings.Join(logged, "\n")
	mu.Unlock()
	require.Contains(t, all, "/nstance.v1.OperatorService/GetConfigStatus")
	require.Contains(t, all, "assignment to entry in nil map")
	require.Contains(t, all, "/nstance.v1.OperatorService/WatchGroups")
	require.Contains(t, all, "stream handler exploded")

	// The same server, on the same connection, still serves.
	svc.boom.Store(false)
	resp, err := c.GetConfigStatus(ctx, &nstancev1.GetConfigStatusRequest{})
	require.NoError(t, err)
	require.Equal(t, "s1", resp.GetShard())
	require.NoError(t, srv.Err())
}

// The test-only panic hook panics only when it is on and the call asks for
// it; the recovery answers Internal either way.
func TestPanicHookOnlyWhenOnAndAsked(t *testing.T) {
	now := time.Now()
	ca, err := pki.GenerateCA("c1", 24*time.Hour, now)
	require.NoError(t, err)
	srvCert, err := ca.ServerKeyPair(pki.ServerIdentity{Shard: "s1", ServerID: "srv"}, []string{"127.0.0.1"}, time.Hour, now)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	asked := metadata.AppendToOutgoingContext(ctx, grpcserve.PanicHookHeader, "1")
	for _, on := range []bool{false, true} {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		srv, err := grpcserve.Start(grpcserve.Config{ClusterID: "c1", ServerCert: srvCert, ClientCAs: ca.Pool(), Operator: &panicky{}, PanicHook: on},
			grpcserve.Listeners{Operator: ln})
		require.NoError(t, err)
		c := nstancev1.NewOperatorServiceClient(dial(t, ln.Addr().String(), ca, clientCert(t, ca, pki.RoleOperator, now)))
		_, err = c.GetConfigStatus(ctx, &nstancev1.GetConfigStatusRequest{})
		require.NoError(t, err, "hook on=%v, not asked", on)
		_, err = c.GetConfigStatus(asked, &nstancev1.GetConfigStatusRequest{})
		if on {
			require.Equal(t, codes.Internal, status.Code(err), "%v", err)
		} else {
			require.NoError(t, err, "hook off ignores the header")
		}
		srv.Stop()
	}
}
