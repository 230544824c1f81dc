package mock_test

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nstance-dev/nstance/internal/server/provider"
	"github.com/nstance-dev/nstance/internal/server/provider/mock"
)

func TestMock(t *testing.T) {
	ctx := context.Background()
	p := mock.New()
	_, err := p.Create(ctx, provider.CreateRequest{InstanceID: "Bad ID"})
	require.Error(t, err)
	inst, err := p.Create(ctx, provider.CreateRequest{InstanceID: "g-1", ProviderID: "nstance://c/s/g-1"})
	require.NoError(t, err)
	require.Equal(t, provider.StateRunning, inst.State)
	_, err = p.Create(ctx, provider.CreateRequest{InstanceID: "g-1", ProviderID: "nstance://c/s/g-1"})
	require.NoError(t, err)
	c, d := p.Counts()
	require.Equal(t, 1, c, "repeated create is idempotent")
	require.Equal(t, 0, d)

	p.FailCreate(func(provider.CreateRequest) error { return errors.New("quota exceeded") })
	_, err = p.Create(ctx, provider.CreateRequest{InstanceID: "g-2"})
	require.ErrorContains(t, err, "quota exceeded")
	p.FailCreate(nil)

	p.Stop("g-1")
	st, err := p.Status(ctx, "g-1")
	require.NoError(t, err)
	require.Equal(t, provider.StateStopped, st.State)
	require.NoError(t, p.Delete(ctx, "g-1"))
	_, err = p.Status(ctx, "g-1")
	require.ErrorIs(t, err, provider.ErrNotFound)
	list, err := p.List(ctx)
	require.NoError(t, err)
	require.Empty(t, list)
}
