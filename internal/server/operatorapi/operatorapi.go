package operatorapi

import (
	"context"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/nstance-dev/nstance/internal/server/authz"
	"github.com/nstance-dev/nstance/internal/server/registration"
	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

// ConfigVersion reports the version of the config the server runs.
type ConfigVersion interface {
	ConfigVersion() (etag string, lastModified time.Time)
}

// Core serves GetConfigStatus and RenewCertificate. Embed it in a fuller
// Operator service implementation; the remaining RPCs are unimplemented.
type Core struct {
	nstancev1.UnimplementedOperatorServiceServer

	Shard  string
	Config ConfigVersion
	Issuer *registration.Issuer
}

// GetConfigStatus reports the etag and modification time of the running config.
func (c *Core) GetConfigStatus(ctx context.Context, _ *nstancev1.GetConfigStatusRequest) (*nstancev1.GetConfigStatusResponse, error) {
	if _, ok := authz.IdentityFrom(ctx); !ok {
		return nil, status.Error(codes.Unauthenticated, "no caller identity")
	}
	resp := &nstancev1.GetConfigStatusResponse{Shard: c.Shard}
	if c.Config != nil {
		etag, mod := c.Config.ConfigVersion()
		resp.Etag = etag
		if !mod.IsZero() {
			resp.LastModified = timestamppb.New(mod)
		}
	}
	return resp, nil
}

// RenewCertificate issues the caller a fresh operator certificate with the same identity.
func (c *Core) RenewCertificate(ctx context.Context, req *nstancev1.RenewCertificateRequest) (*nstancev1.RenewCertificateResponse, error) {
	id, ok := authz.IdentityFrom(ctx)
	if !ok {
		return nil, status.Error(codes.Unauthenticated, "no caller identity")
	}
	cert, ok := authz.PeerCertificate(ctx)
	if !ok {
		return nil, status.Error(codes.Unauthenticated, "no verified client certificate")
	}
	issued, err := c.Issuer.Renew(id, cert, req.GetPublicKeyPem())
	if err != nil {
		return nil, err
	}
	return &nstancev1.RenewCertificateResponse{
		CertificatePem: issued.CertificatePEM, CaChainPem: issued.CAChainPEM, ExpiresAt: issued.ExpiresAt, Identity: issued.Identity,
	}, nil
}
