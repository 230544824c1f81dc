package authz

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"slices"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/nstance-dev/nstance/internal/pki"
)

type ctxKey struct{}

// WithIdentity returns ctx carrying id.
func WithIdentity(ctx context.Context, id pki.Identity) context.Context {
	return context.WithValue(ctx, ctxKey{}, id)
}

// IdentityFrom returns the caller identity placed in ctx by the interceptors.
func IdentityFrom(ctx context.Context) (pki.Identity, bool) {
	id, ok := ctx.Value(ctxKey{}).(pki.Identity)
	return id, ok
}

// Policy is what a listener requires of its callers: a verified client
// certificate of the cluster whose role is one of Roles.
type Policy struct {
	Roles     []pki.Role
	ClusterID string
}

// Authenticate checks the verified peer certificate in ctx against p and
// returns the caller identity.
func (p Policy) Authenticate(ctx context.Context) (pki.Identity, error) {
	pr, ok := peer.FromContext(ctx)
	if !ok || pr.AuthInfo == nil {
		return pki.Identity{}, status.Error(codes.Unauthenticated, "no TLS peer information")
	}
	info, ok := pr.AuthInfo.(credentials.TLSInfo)
	if !ok {
		return pki.Identity{}, status.Errorf(codes.Unauthenticated, "connection is not TLS (%s)", pr.AuthInfo.AuthType())
	}
	chains := info.State.VerifiedChains
	if len(chains) == 0 || len(chains[0]) == 0 {
		return pki.Identity{}, status.Error(codes.Unauthenticated, "no verified client certificate")
	}
	id, err := pki.IdentityFromCert(chains[0][0], p.ClusterID)
	if err != nil {
		return pki.Identity{}, status.Errorf(codes.PermissionDenied, "client certificate: %v", err)
	}
	if !slices.Contains(p.Roles, id.Role) {
		return pki.Identity{}, status.Error(codes.PermissionDenied, fmt.Sprintf("client role %q may not call this service (roles %v)", id.Role, p.Roles))
	}
	return id, nil
}

// RequireRole checks that the caller identity in ctx has one of roles: the
// check of actions only some roles of a listener may take (RefreshConfig is
// an admin action on the Operator listener).
func RequireRole(ctx context.Context, roles ...pki.Role) (pki.Identity, error) {
	id, ok := IdentityFrom(ctx)
	if !ok {
		return pki.Identity{}, status.Error(codes.Unauthenticated, "no caller identity")
	}
	if !slices.Contains(roles, id.Role) {
		return pki.Identity{}, status.Errorf(codes.PermissionDenied, "this action needs role %v, the caller has role %q", roles, id.Role)
	}
	return id, nil
}

// Unary returns the unary interceptor for p.
func (p Policy) Unary() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		id, err := p.Authenticate(ctx)
		if err != nil {
			return nil, err
		}
		return handler(WithIdentity(ctx, id), req)
	}
}

// Stream returns the stream interceptor for p.
func (p Policy) Stream() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		id, err := p.Authenticate(ss.Context())
		if err != nil {
			return err
		}
		return handler(srv, &identityStream{ServerStream: ss, ctx: WithIdentity(ss.Context(), id)})
	}
}

type identityStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s *identityStream) Context() context.Context { return s.ctx }

// ServerOptions returns the grpc options that install p's interceptors.
func (p Policy) ServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{grpc.ChainUnaryInterceptor(p.Unary()), grpc.ChainStreamInterceptor(p.Stream())}
}

// PeerCertificate returns the verified client certificate of the caller.
func PeerCertificate(ctx context.Context) (*x509.Certificate, bool) {
	pr, ok := peer.FromContext(ctx)
	if !ok {
		return nil, false
	}
	info, ok := pr.AuthInfo.(credentials.TLSInfo)
	if !ok || len(info.State.VerifiedChains) == 0 || len(info.State.VerifiedChains[0]) == 0 {
		return nil, false
	}
	return info.State.VerifiedChains[0][0], true
}

// Gate decides whether a verified client certificate may still be used
// (revocation).
type Gate interface {
	// Admit returns an error when cert (of identity id) is refused; it is
	// asked on every RPC and should answer from memory.
	Admit(cert *x509.Certificate, id pki.Identity) error
	// AdmitHandshake is Admit for a new connection (it may read storage).
	AdmitHandshake(cert *x509.Certificate, id pki.Identity) error
	// Track returns a context that ends as soon as cert is refused, and a
	// function to call when the stream ends.
	Track(ctx context.Context, cert *x509.Certificate, id pki.Identity) (context.Context, func())
}

// gateCaller returns the verified client certificate of ctx and its
// identity; ok is false when there is none (the role check refuses those).
func gateCaller(ctx context.Context, clusterID string) (*x509.Certificate, pki.Identity, bool) {
	cert, ok := PeerCertificate(ctx)
	if !ok {
		return nil, pki.Identity{}, false
	}
	id, err := pki.IdentityFromCert(cert, clusterID)
	if err != nil {
		return nil, pki.Identity{}, false
	}
	return cert, id, true
}

// GateOptions returns interceptors that ask gate about the caller's
// certificate on every RPC (PermissionDenied when refused) and end a stream
// with PermissionDenied as soon as the gate stops admitting it. They work
// from the peer certificate, so their place in the chain does not matter.
func GateOptions(clusterID string, gate Gate) []grpc.ServerOption {
	unary := func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if cert, id, ok := gateCaller(ctx, clusterID); ok {
			if err := gate.Admit(cert, id); err != nil {
				return nil, status.Errorf(codes.PermissionDenied, "client certificate: %v", err)
			}
		}
		return handler(ctx, req)
	}
	stream := func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		ctx := ss.Context()
		cert, id, ok := gateCaller(ctx, clusterID)
		if !ok {
			return handler(srv, ss)
		}
		if err := gate.Admit(cert, id); err != nil {
			return status.Errorf(codes.PermissionDenied, "client certificate: %v", err)
		}
		tctx, done := gate.Track(ctx, cert, id)
		defer done()
		err := handler(srv, &identityStream{ServerStream: ss, ctx: tctx})
		if cause := context.Cause(tctx); cause != nil && !errors.Is(cause, context.Canceled) && ctx.Err() == nil {
			return status.Errorf(codes.PermissionDenied, "client certificate: %v", cause)
		}
		return err
	}
	return []grpc.ServerOption{grpc.ChainUnaryInterceptor(unary), grpc.ChainStreamInterceptor(stream)}
}
