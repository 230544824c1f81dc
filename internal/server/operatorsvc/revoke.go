package operatorsvc

import (
	"context"
	"errors"
	"sort"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/nstance-dev/nstance/internal/layout"
	"github.com/nstance-dev/nstance/internal/pki"
	"github.com/nstance-dev/nstance/internal/server/authz"
	"github.com/nstance-dev/nstance/internal/server/revocation"
	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

// revocations checks that the caller is an admin and that this server
// serves the revocation RPCs.
func (s *Service) revocations(ctx context.Context) (*revocation.Gate, pki.Identity, error) {
	id, err := authz.RequireRole(ctx, pki.RoleAdmin)
	if err != nil {
		return nil, pki.Identity{}, err
	}
	if s.o.Revocations == nil {
		return nil, pki.Identity{}, status.Error(codes.Unimplemented, "this server keeps no revocations")
	}
	return s.o.Revocations, id, nil
}

// ListOperators implements the RPC (admin only): every operator record of the cluster.
func (s *Service) ListOperators(ctx context.Context, _ *nstancev1.ListOperatorsRequest) (*nstancev1.ListOperatorsResponse, error) {
	g, _, err := s.revocations(ctx)
	if err != nil {
		return nil, err
	}
	recs, err := g.Operators(ctx)
	if err != nil {
		return nil, status.Errorf(codes.Unavailable, "listing operators: %v", err)
	}
	resp := &nstancev1.ListOperatorsResponse{}
	for _, r := range recs {
		role := nstancev1.ClientRole_CLIENT_ROLE_OPERATOR
		if r.Role == string(pki.RoleAdmin) {
			role = nstancev1.ClientRole_CLIENT_ROLE_ADMIN
		}
		resp.Operators = append(resp.Operators, &nstancev1.OperatorRegistration{
			OperatorId: r.ID, Tenant: r.Tenant, Role: role, Uri: r.URI, Serial: r.Serial,
			ExpiresAt: optTime(r.ExpiresAt), RegisteredAt: optTime(r.RegisteredAt), RegisteredBy: r.RegisteredBy,
		})
	}
	sort.Slice(resp.Operators, func(i, j int) bool { return resp.Operators[i].GetOperatorId() < resp.Operators[j].GetOperatorId() })
	return resp, nil
}

// ListRevocations implements the RPC (admin only): the entries this shard enforces.
func (s *Service) ListRevocations(ctx context.Context, _ *nstancev1.ListRevocationsRequest) (*nstancev1.ListRevocationsResponse, error) {
	g, _, err := s.revocations(ctx)
	if err != nil {
		return nil, err
	}
	resp := &nstancev1.ListRevocationsResponse{}
	for _, e := range g.Entries() {
		resp.Revocations = append(resp.Revocations, RevocationProto(e))
	}
	return resp, nil
}

// Revoke implements the RPC (admin only).
func (s *Service) Revoke(ctx context.Context, req *nstancev1.RevokeRequest) (*nstancev1.RevokeResponse, error) {
	g, id, err := s.revocations(ctx)
	if err != nil {
		return nil, err
	}
	by := id.URI().String()
	var e revocation.Entry
	switch t := req.GetTarget().(type) {
	case *nstancev1.RevokeRequest_OperatorId:
		tenant, terr := operatorTenant(ctx, g, t.OperatorId, req.GetTenant())
		if terr != nil {
			return nil, terr
		}
		e, err = g.RevokeOperatorBy(ctx, tenant, t.OperatorId, req.GetReason(), by)
	case *nstancev1.RevokeRequest_InstanceId:
		e, err = g.Revoke(ctx, revocation.Entry{Kind: revocation.KindAgent, Subject: t.InstanceId, Shard: s.o.Shard, Reason: req.GetReason(), RevokedBy: by})
	case *nstancev1.RevokeRequest_Serial:
		e, err = g.Revoke(ctx, revocation.Entry{Kind: revocation.KindSerial, Serial: t.Serial, Reason: req.GetReason(), RevokedBy: by})
	default:
		return nil, status.Error(codes.InvalidArgument, "target: one of operator_id, instance_id or serial is required")
	}
	if errors.Is(err, revocation.ErrInvalid) {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	if err != nil {
		return nil, status.Errorf(codes.Unavailable, "revoking: %v", err)
	}
	return &nstancev1.RevokeResponse{Revocation: RevocationProto(e)}, nil
}

// operatorTenant is the tenant whose operator id a Revoke names: the one
// given, else the only tenant with a record of that id. Operator ids are
// scoped to their tenant, so naming none when several (or no) tenants have
// the id is refused rather than guessed.
func operatorTenant(ctx context.Context, g *revocation.Gate, id, tenant string) (string, error) {
	if tenant != "" {
		if err := layout.ValidateID("tenant", tenant); err != nil {
			return "", status.Errorf(codes.InvalidArgument, "tenant: %v", err)
		}
		return tenant, nil
	}
	if err := layout.ValidateID("operator id", id); err != nil {
		return "", status.Errorf(codes.InvalidArgument, "operator_id: %v", err)
	}
	tenants, err := g.OperatorTenants(ctx, id)
	if err != nil {
		return "", status.Errorf(codes.Unavailable, "finding the tenant of operator %q: %v", id, err)
	}
	switch len(tenants) {
	case 1:
		return tenants[0], nil
	case 0:
		return "", status.Errorf(codes.InvalidArgument, "tenant: required: operator %q has no record in any tenant, so name the tenant whose certificates to revoke", id)
	}
	return "", status.Errorf(codes.InvalidArgument, "tenant: required: operator %q is registered in tenants %s; name one", id, strings.Join(tenants, ", "))
}

// RevocationProto converts an entry to its wire form.
func RevocationProto(e revocation.Entry) *nstancev1.Revocation {
	kind := nstancev1.RevocationKind_REVOCATION_KIND_UNSPECIFIED
	switch e.Kind {
	case revocation.KindOperator:
		kind = nstancev1.RevocationKind_REVOCATION_KIND_OPERATOR
	case revocation.KindAgent:
		kind = nstancev1.RevocationKind_REVOCATION_KIND_AGENT
	case revocation.KindSerial:
		kind = nstancev1.RevocationKind_REVOCATION_KIND_SERIAL
	}
	return &nstancev1.Revocation{
		Id: e.ID, Kind: kind, Subject: e.Subject, Tenant: e.Tenant, Shard: e.Shard, Serial: e.Serial, Uri: e.URI,
		IssuedBefore: optTime(e.IssuedBefore), ExpiresAt: optTime(e.ExpiresAt), RevokedAt: optTime(e.RevokedAt),
		RevokedBy: e.RevokedBy, Reason: e.Reason,
	}
}

func optTime(t time.Time) *timestamppb.Timestamp {
	if t.IsZero() {
		return nil
	}
	return timestamppb.New(t)
}
