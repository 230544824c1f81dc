package regoutcome

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestClassify(t *testing.T) {
	for _, tt := range []struct {
		err  error
		want Outcome
	}{
		{context.DeadlineExceeded, Transient},
		{errors.New("connection reset"), Transient},
		{status.Error(codes.Unavailable, ""), Transient},
		{status.Error(codes.Internal, ""), Transient},
		{status.Error(codes.ResourceExhausted, "rate limited"), Transient},
		{status.Error(codes.FailedPrecondition, "not valid yet"), NotYetValid},
		{status.Error(codes.InvalidArgument, ""), Definite},
		{status.Error(codes.Unauthenticated, ""), Definite},
		{status.Error(codes.PermissionDenied, ""), Definite},
		{status.Error(codes.AlreadyExists, "nonce used"), Definite},
		{status.Error(codes.NotFound, ""), Definite},
		{status.Error(codes.Unimplemented, ""), Definite},
		{status.Error(codes.OutOfRange, ""), Definite},
	} {
		require.Equal(t, tt.want, Classify(tt.err), "%v", tt.err)
	}
	require.Equal(t, "not-yet-valid", NotYetValid.String())
}
