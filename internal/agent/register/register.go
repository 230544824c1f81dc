package register

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/go-logr/logr"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	"github.com/nstance-dev/nstance/internal/agent/backoff"
	"github.com/nstance-dev/nstance/internal/agent/identity"
	"github.com/nstance-dev/nstance/internal/msgsize"
	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

// ErrRefused wraps a registration the server refused for good (bad, expired
// or already used nonce, invalid request). Retrying cannot help.
var ErrRefused = errors.New("registration refused")

// Options configure Ensure.
type Options struct {
	Addr       string
	ServerName string
	Identity   *identity.Dir
	Hostname   string
	IPs        []string
	Backoff    backoff.Backoff
	// AttemptTimeout bounds one RegisterAgent call (default 15s).
	AttemptTimeout time.Duration
	Log            logr.Logger
}

// Ensure returns once the identity directory holds a valid certificate,
// registering first when needed.
func Ensure(ctx context.Context, o Options) error {
	certErr := error(nil)
	if _, err := o.Identity.Certificate(time.Now()); err == nil {
		// A nonce left over from a crash after the certificate was stored is useless now.
		return o.Identity.RemoveNonce()
	} else if !errors.Is(err, identity.ErrNotRegistered) {
		return err
	} else {
		certErr = err
	}
	tok, err := o.Identity.Nonce()
	if err != nil {
		if certErr != identity.ErrNotRegistered { //nolint:errorlint // the bare sentinel means "no certificate stored"
			// A certificate is stored but unusable: most likely it expired
			// because it was not renewed in time. Say so loudly.
			o.Log.Error(certErr, "!!! the stored agent identity cannot be used and there is no nonce to register again: this instance cannot connect until it is replaced",
				"dir", o.Identity.Path(""))
		}
		return fmt.Errorf("%w: not registered and no nonce: %v (stored identity: %v)", ErrRefused, err, certErr)
	}
	pubPEM, err := o.Identity.PublicKeyPEM()
	if err != nil {
		return err
	}
	if o.AttemptTimeout <= 0 {
		o.AttemptTimeout = 15 * time.Second
	}
	for {
		resp, err := attempt(ctx, o, &nstancev1.RegisterAgentRequest{Nonce: tok, PublicKeyPem: pubPEM, Hostname: o.Hostname, IpAddresses: o.IPs})
		if err == nil {
			if err := o.Identity.SaveCertificate(resp.GetCertificatePem(), resp.GetCaChainPem()); err != nil {
				return err
			}
			if err := o.Identity.RemoveNonce(); err != nil {
				return err
			}
			o.Log.Info("registered", "client", resp.GetIdentity().GetClientId(), "tenant", resp.GetIdentity().GetTenant(),
				"group", resp.GetIdentity().GetGroupId(), "expires", resp.GetExpiresAt().AsTime())
			return nil
		}
		if permanent(err) {
			return fmt.Errorf("%w: %v", ErrRefused, err)
		}
		o.Log.Error(err, "registration failed; retrying", "addr", o.Addr)
		if werr := o.Backoff.Wait(ctx); werr != nil {
			return fmt.Errorf("registering: %w (last error: %v)", werr, err)
		}
	}
}

func attempt(ctx context.Context, o Options, req *nstancev1.RegisterAgentRequest) (*nstancev1.RegisterAgentResponse, error) {
	tlsCfg, err := o.Identity.RegistrationTLS(o.ServerName)
	if err != nil {
		return nil, err
	}
	conn, err := grpc.NewClient(o.Addr, grpc.WithTransportCredentials(credentials.NewTLS(tlsCfg)), msgsize.DialOption())
	if err != nil {
		return nil, fmt.Errorf("dialing %s: %w", o.Addr, err)
	}
	defer conn.Close()
	actx, cancel := context.WithTimeout(ctx, o.AttemptTimeout)
	defer cancel()
	resp, err := nstancev1.NewRegistrationServiceClient(conn).RegisterAgent(actx, req)
	if err != nil {
		return nil, err
	}
	return resp, nil
}

func permanent(err error) bool {
	switch status.Code(err) {
	case codes.InvalidArgument, codes.Unauthenticated, codes.PermissionDenied, codes.AlreadyExists, codes.FailedPrecondition:
		return true
	}
	return false
}
