package limits

import (
	"context"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
)

// KeyFunc names the caller a limit is counted against; false means the
// caller has no key (the interceptor then refuses, since the authentication
// interceptors before it should have placed one).
type KeyFunc func(ctx context.Context) (string, bool)

// StreamsPerKey caps concurrent server-streaming RPCs (watches) per caller
// key; what is the limit's name for the refusal message.
func StreamsPerKey(c *Counter, key KeyFunc, what string) grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
		if !info.IsServerStream || info.IsClientStream {
			return h(srv, ss)
		}
		k, ok := key(ss.Context())
		if !ok {
			return status.Error(codes.Unauthenticated, "no caller identity for the stream limit")
		}
		release, ok := c.Acquire(k)
		if !ok {
			return status.Errorf(codes.ResourceExhausted, "too many open streams: %d already open for this caller (%s); close some first", c.Max(), what)
		}
		defer release()
		return h(srv, ss)
	}
}

// RatePerSource limits unary calls per source IP address with r.
func RatePerSource(r *KeyedRate, what string) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		src := ""
		if p, ok := peer.FromContext(ctx); ok {
			src = SourceIP(p.Addr)
		}
		switch r.Allow(src) {
		case RateExceeded:
			return nil, status.Errorf(codes.ResourceExhausted, "too many attempts from this address (%s); retry later", what)
		case TooManyKeys:
			return nil, status.Errorf(codes.ResourceExhausted, "too many sources are retrying at once (%s); retry later", what)
		}
		return h(ctx, req)
	}
}
