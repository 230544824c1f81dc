package nstancev1_test

import (
	"context"
	"errors"
	"io"
	"net"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

// operatorStub implements two Operator RPCs so the generated client and server
// wiring can be exercised over a real TCP connection. Everything else falls
// through to the generated Unimplemented handlers.
type operatorStub struct {
	nstancev1.UnimplementedOperatorServiceServer
	config *nstancev1.GetConfigStatusResponse
	events []*nstancev1.GroupEvent
}

func (s *operatorStub) GetConfigStatus(context.Context, *nstancev1.GetConfigStatusRequest) (*nstancev1.GetConfigStatusResponse, error) {
	return s.config, nil
}

func (s *operatorStub) WatchGroups(req *nstancev1.WatchGroupsRequest, stream grpc.ServerStreamingServer[nstancev1.GroupEvent]) error {
	for _, ev := range s.events {
		if len(req.GetGroupIds()) > 0 && !slices.Contains(req.GetGroupIds(), ev.GetGroupId()) {
			continue
		}
		if err := stream.Send(ev); err != nil {
			return err
		}
	}
	return nil
}

func startOperatorServer(t *testing.T, impl nstancev1.OperatorServiceServer) nstancev1.OperatorServiceClient {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := grpc.NewServer()
	nstancev1.RegisterOperatorServiceServer(srv, impl)
	served := make(chan error, 1)
	go func() { served <- srv.Serve(lis) }()
	t.Cleanup(func() {
		srv.Stop()
		require.NoError(t, <-served)
	})

	// Plaintext is acceptable here only: this test checks code generation and wiring, not transport security.
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	return nstancev1.NewOperatorServiceClient(conn)
}

func TestOperatorServiceOverGRPC(t *testing.T) {
	deleteEvent := &nstancev1.GroupEvent{Type: nstancev1.GroupEventType_GROUP_EVENT_TYPE_DELETE, GroupId: "batch", OccurredAt: ts(time.Second), Shard: "dev-1"}
	upsertWeb := &nstancev1.GroupEvent{Type: nstancev1.GroupEventType_GROUP_EVENT_TYPE_UPSERT, GroupId: "web", Group: groupStatus(), Snapshot: true, OccurredAt: ts(0), Shard: "dev-1"}
	upsertBatch := &nstancev1.GroupEvent{Type: nstancev1.GroupEventType_GROUP_EVENT_TYPE_UPSERT, GroupId: "batch", Group: &nstancev1.GroupStatus{Spec: &nstancev1.GroupSpec{GroupId: "batch", Size: 2}}, Snapshot: true, OccurredAt: ts(0), Shard: "dev-1"}
	stub := &operatorStub{
		config: &nstancev1.GetConfigStatusResponse{Etag: "d41d8cd98f00b204e9800998ecf8427e", LastModified: ts(-time.Hour), Shard: "dev-1"},
		events: []*nstancev1.GroupEvent{upsertWeb, upsertBatch, deleteEvent},
	}
	client := startOperatorServer(t, stub)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	t.Run("unary GetConfigStatus", func(t *testing.T) {
		got, err := client.GetConfigStatus(ctx, &nstancev1.GetConfigStatusRequest{})
		require.NoError(t, err)
		require.True(t, proto.Equal(stub.config, got), "got %v", got)
	})

	t.Run("unimplemented RPC reports Unimplemented", func(t *testing.T) {
		_, err := client.ListGroups(ctx, &nstancev1.ListGroupsRequest{})
		require.Equal(t, codes.Unimplemented, status.Code(err))
	})

	watchTests := []struct {
		name   string
		filter []string
		want   []*nstancev1.GroupEvent
	}{
		{name: "all groups", filter: nil, want: []*nstancev1.GroupEvent{upsertWeb, upsertBatch, deleteEvent}},
		{name: "filtered to batch", filter: []string{"batch"}, want: []*nstancev1.GroupEvent{upsertBatch, deleteEvent}},
		{name: "filter matching nothing", filter: []string{"absent"}, want: nil},
	}
	for _, tt := range watchTests {
		t.Run("server stream WatchGroups/"+tt.name, func(t *testing.T) {
			stream, err := client.WatchGroups(ctx, &nstancev1.WatchGroupsRequest{GroupIds: tt.filter})
			require.NoError(t, err)
			var got []*nstancev1.GroupEvent
			for {
				ev, err := stream.Recv()
				if errors.Is(err, io.EOF) {
					break
				}
				require.NoError(t, err)
				got = append(got, ev)
			}
			require.Len(t, got, len(tt.want))
			for i := range tt.want {
				require.True(t, proto.Equal(tt.want[i], got[i]), "event %d: got %v", i, got[i])
			}
			for _, ev := range got {
				if ev.GetType() == nstancev1.GroupEventType_GROUP_EVENT_TYPE_DELETE {
					require.Nil(t, ev.GetGroup(), "DELETE events carry only the group id")
				}
			}
		})
	}
}
