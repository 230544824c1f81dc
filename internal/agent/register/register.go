package register

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/go-logr/logr"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	"github.com/nstance-dev/nstance/internal/regoutcome"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/nstance-dev/nstance/internal/agent/identity"
	"github.com/nstance-dev/nstance/internal/msgsize"
	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

// ErrRefused wraps a registration the server refused for good (bad, expired
// or already used nonce, an instance that may not register, an invalid
// request). Retrying cannot help.
var ErrRefused = errors.New("registration refused")

// DefaultSkewAllowance is how long a nonce the server finds "not valid yet"
// is retried: the server that minted it has a clock ahead of the one that
// checks it, by less than this, one hopes.
const DefaultSkewAllowance = 5 * time.Minute

// Options configure Ensure.
type Options struct {
	Addr       string
	ServerName string
	Identity   *identity.Dir
	// Backoff spaces the attempts after transient failures; its Steps are
	// ignored (transient failures are retried until ctx ends or the server
	// refuses for good) and a zero Duration means 500ms doubling to 30s.
	Backoff wait.Backoff
	// SkewAllowance bounds the retries of a nonce that is not valid yet
	// (default DefaultSkewAllowance).
	SkewAllowance time.Duration
	// AttemptTimeout bounds one RegisterAgent call (default 15s).
	AttemptTimeout time.Duration
	Log            logr.Logger
	// Now defaults to time.Now.
	Now func() time.Time
}

// Ensure returns once the identity directory holds a valid certificate,
// registering first when needed. The request carries no names: the
// certificate's come from the server's record of the instance. A lost reply
// is safe to retry: the server answers a retry with the same key with the
// certificate it issued first.
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
	// A nonce that does not even say which shard it is for never becomes
	// usable: no retry can help.
	if _, err := o.Identity.RegistrationTLS(o.ServerName); err != nil {
		return fmt.Errorf("%w: %v; this nonce cannot register the instance, which needs a new one", ErrRefused, err)
	}
	if o.AttemptTimeout <= 0 {
		o.AttemptTimeout = 15 * time.Second
	}
	if o.SkewAllowance <= 0 {
		o.SkewAllowance = DefaultSkewAllowance
	}
	now := time.Now
	if o.Now != nil {
		now = o.Now
	}
	bo := o.Backoff
	if bo.Duration <= 0 {
		bo = wait.Backoff{Duration: 500 * time.Millisecond, Factor: 2, Jitter: 0.2, Cap: 30 * time.Second}
	}
	bo.Steps = math.MaxInt32
	var earlySince time.Time
	for attempt := 1; ; attempt++ {
		resp, err := call(ctx, o, &nstancev1.RegisterAgentRequest{Nonce: tok, PublicKeyPem: pubPEM})
		if err == nil {
			if err := o.Identity.SaveCertificate(resp.GetCertificatePem(), resp.GetCaChainPem()); err != nil {
				return err
			}
			if err := o.Identity.RemoveNonce(); err != nil {
				return err
			}
			o.Log.Info("registered", "client", resp.GetIdentity().GetClientId(), "tenant", resp.GetIdentity().GetTenant(),
				"group", resp.GetIdentity().GetGroupId(), "expires", resp.GetExpiresAt().AsTime(), "attempts", attempt)
			return nil
		}
		switch regoutcome.Classify(err) {
		case regoutcome.Definite:
			return fmt.Errorf("%w by %s: %s (%s); this nonce cannot register the instance, which needs a new one",
				ErrRefused, o.Addr, status.Convert(err).Message(), status.Code(err))
		case regoutcome.NotYetValid:
			if earlySince.IsZero() {
				earlySince = now()
			}
			if waited := now().Sub(earlySince); waited >= o.SkewAllowance {
				return fmt.Errorf("%w by %s: the nonce is still not valid yet after %s of retries: the clock of the server that "+
					"minted it is ahead of this server's by more than the allowance; fix the servers' clocks (NTP)",
					ErrRefused, o.Addr, waited.Round(time.Second))
			}
		}
		d := bo.Step()
		o.Log.Error(err, "registration failed; retrying", "addr", o.Addr, "attempt", attempt, "in", d.Round(time.Millisecond).String())
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("registering: %w (last error: %v)", ctx.Err(), err)
		case <-t.C:
		}
	}
}

func call(ctx context.Context, o Options, req *nstancev1.RegisterAgentRequest) (*nstancev1.RegisterAgentResponse, error) {
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
	return nstancev1.NewRegistrationServiceClient(conn).RegisterAgent(actx, req)
}
