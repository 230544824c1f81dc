package provider_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nstance-dev/nstance/internal/server/provider"
	"github.com/nstance-dev/nstance/internal/server/provider/mock"
)

var errLapsed = errors.New("lease lapsed")

type fence struct {
	ok       bool
	deadline time.Time
}

func (f *fence) Bound(ctx context.Context) (context.Context, context.CancelFunc, error) {
	if !f.ok {
		ctx, cancel := context.WithCancel(ctx)
		cancel()
		return ctx, cancel, errLapsed
	}
	c, cancel := context.WithDeadline(ctx, f.deadline)
	return c, cancel, nil
}

// A fenced provider creates and deletes only while the fence allows it;
// reads pass through either way.
func TestFencedProvider(t *testing.T) {
	ctx := context.Background()
	inner := mock.New()
	f := &fence{ok: true, deadline: time.Now().Add(time.Hour)}
	p := provider.Fenced(inner, f)
	inst, err := p.Create(ctx, provider.CreateRequest{InstanceID: "i-1"})
	require.NoError(t, err)

	f.ok = false
	_, err = p.Create(ctx, provider.CreateRequest{InstanceID: "i-2"})
	require.ErrorIs(t, err, errLapsed)
	require.ErrorIs(t, p.Delete(ctx, inst.InstanceID), errLapsed)
	list, err := inner.List(ctx)
	require.NoError(t, err)
	require.Len(t, list, 1, "nothing created or deleted behind the fence")
	_, err = p.Status(ctx, inst.InstanceID)
	require.NoError(t, err, "reads are not fenced")
}
