package operatorsvc

import (
	"context"
	"encoding/json"
	"errors"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/nstance-dev/nstance/internal/layout"
	"github.com/nstance-dev/nstance/internal/pki"
	"github.com/nstance-dev/nstance/internal/server/authz"
	"github.com/nstance-dev/nstance/internal/server/registration"
	"github.com/nstance-dev/nstance/pkg/objstore"
	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

// OperatorRecords reads and updates operator records.
type OperatorRecords struct {
	Store objstore.Store
	Keys  layout.Keys
}

// check returns the caller's record, read from its tenant's key (or a
// record of an older version that names the caller's tenant), or
// PermissionDenied. Another tenant's operator of the same id is never
// the caller's record.
func (o *OperatorRecords) check(ctx context.Context, id pki.Identity) (*registration.StoredOperator, error) {
	st, err := registration.ReadOperatorRecord(ctx, o.Store, o.Keys, id.Tenant, id.ClientID)
	switch {
	case errors.Is(err, objstore.ErrNotFound):
		return nil, status.Errorf(codes.PermissionDenied, "operator %q of tenant %q is not registered (its record was deleted or never written)", id.ClientID, id.Tenant)
	case errors.Is(err, registration.ErrOperatorUnreadable):
		return nil, status.Errorf(codes.PermissionDenied, "operator %q: its record is unreadable: %v", id.ClientID, err)
	case err != nil:
		return nil, status.Errorf(codes.Unavailable, "reading the operator record: %v", err)
	}
	role := st.Record.Role
	if role == "" {
		role = string(pki.RoleOperator)
	}
	if st.Record.Tenant != id.Tenant || role != string(id.Role) {
		return nil, status.Errorf(codes.PermissionDenied, "operator %q: the certificate's tenant or role does not match its record", id.ClientID)
	}
	return st, nil
}

// renewed records the serial and expiry of a renewed certificate where the
// record was read; losing the race with another write only loses
// bookkeeping.
func (o *OperatorRecords) renewed(ctx context.Context, st *registration.StoredOperator, issued *registration.Issued) error {
	rec := st.Record
	rec.Serial, rec.ExpiresAt = issued.Serial, issued.NotAfter
	body, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	_, err = o.Store.Put(ctx, st.Key, body, objstore.PutOptions{IfMatch: st.ETag})
	return err
}

// RenewCertificate issues the caller a fresh certificate with the same
// identity (operator or admin), after checking its operator record.
func (s *Service) RenewCertificate(ctx context.Context, req *nstancev1.RenewCertificateRequest) (*nstancev1.RenewCertificateResponse, error) {
	if s.o.Issuer == nil {
		return nil, status.Error(codes.Unimplemented, "certificate renewal is not configured on this server")
	}
	id, ok := authz.IdentityFrom(ctx)
	if !ok {
		return nil, status.Error(codes.Unauthenticated, "no caller identity")
	}
	cert, ok := authz.PeerCertificate(ctx)
	if !ok {
		return nil, status.Error(codes.Unauthenticated, "no verified client certificate")
	}
	var rec *registration.StoredOperator
	if s.o.Operators != nil {
		var err error
		if rec, err = s.o.Operators.check(ctx, id); err != nil {
			return nil, err
		}
	}
	issued, err := s.o.Issuer.Renew(id, cert, req.GetPublicKeyPem())
	if err != nil {
		return nil, err
	}
	if rec != nil {
		if err := s.o.Operators.renewed(ctx, rec, issued); err != nil {
			s.o.Log.Error(err, "recording the renewed operator certificate", "operator", id.ClientID, "serial", issued.Serial)
		}
	}
	return &nstancev1.RenewCertificateResponse{
		CertificatePem: issued.CertificatePEM, CaChainPem: issued.CAChainPEM, ExpiresAt: issued.ExpiresAt, Identity: issued.Identity,
	}, nil
}
