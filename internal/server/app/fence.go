package app

import (
	"context"
	"fmt"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/nstance-dev/nstance/internal/server/election"
	"github.com/nstance-dev/nstance/pkg/objstore"
)

// leaderFence lets a shard leader act only while its shard lease allows it
// (election.Elector.Check/Bound): every state-changing storage write,
// provider call and RPC of the leader passes through it. Before the shard
// elector exists nothing may act.
type leaderFence struct{ a *App }

func (f leaderFence) elector() *election.Elector {
	f.a.mu.Lock()
	defer f.a.mu.Unlock()
	return f.a.shardEl
}

// Check returns nil while this server may act as its shard's leader.
func (f leaderFence) Check() error {
	el := f.elector()
	if el == nil {
		return fmt.Errorf("%w: shard election not started", election.ErrNotLeader)
	}
	return el.Check(0)
}

// Bound limits ctx to the leader's validity.
func (f leaderFence) Bound(ctx context.Context) (context.Context, context.CancelFunc, error) {
	el := f.elector()
	if el == nil {
		ctx, cancel := context.WithCancel(ctx)
		cancel()
		return ctx, cancel, fmt.Errorf("%w: shard election not started", election.ErrNotLeader)
	}
	return el.Bound(ctx)
}

// grpcOptions refuse every RPC with Unavailable unless this server may act
// as the leader; a unary handler's context ends when the leader would stop
// acting. Streams are cut when the term ends (leadShard stops the servers).
func (f leaderFence) grpcOptions() []grpc.ServerOption {
	refuse := status.Error(codes.Unavailable, "this server is not the shard leader")
	return []grpc.ServerOption{
		grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			bctx, cancel, err := f.Bound(ctx)
			defer cancel()
			if err != nil {
				return nil, refuse
			}
			return h(bctx, req)
		}),
		grpc.ChainStreamInterceptor(func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, h grpc.StreamHandler) error {
			if f.Check() != nil {
				return refuse
			}
			return h(srv, ss)
		}),
	}
}

// leaderStore is the store for everything the shard leader writes.
func (a *App) leaderStore() objstore.Store {
	return fencedStore{Store: a.o.Store, fence: leaderFence{a: a}}
}

// fencedStore refuses writes and deletes unless the fence allows them, and
// bounds each by the leader's validity; reads pass through.
type fencedStore struct {
	objstore.Store
	fence interface {
		Bound(context.Context) (context.Context, context.CancelFunc, error)
	}
}

func (s fencedStore) Put(ctx context.Context, key string, body []byte, opts objstore.PutOptions) (string, error) {
	ctx, cancel, err := s.fence.Bound(ctx)
	defer cancel()
	if err != nil {
		return "", fmt.Errorf("writing %s: %w", key, err)
	}
	return s.Store.Put(ctx, key, body, opts)
}

func (s fencedStore) Delete(ctx context.Context, key string) error {
	ctx, cancel, err := s.fence.Bound(ctx)
	defer cancel()
	if err != nil {
		return fmt.Errorf("deleting %s: %w", key, err)
	}
	return s.Store.Delete(ctx, key)
}
