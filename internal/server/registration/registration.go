package registration

import (
	"context"
	"crypto"
	"crypto/ed25519"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"regexp"
	"time"

	"github.com/go-logr/logr"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/nstance-dev/nstance/internal/layout"
	"github.com/nstance-dev/nstance/internal/nonce"
	"github.com/nstance-dev/nstance/internal/pki"
	"github.com/nstance-dev/nstance/pkg/objstore"
	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

// Request size limits.
const (
	maxNonceLen   = 8 << 10
	maxKeyPEMLen  = 4 << 10
	maxIPs        = 16
	maxHostLength = 253
)

var hostnamePattern = regexp.MustCompile(`^[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$`)

// Issuer signs client certificates with the cluster CA.
type Issuer struct {
	// CA signs when Trust is nil.
	CA *pki.CA
	// Trust, when set, takes the place of CA: certificates are signed by its current
	// signer and the CA chain returned is its bundle (both CAs during a
	// rotation), so every client learns the CAs to verify servers with.
	Trust            *pki.Trust
	ClusterID        string
	AgentValidity    time.Duration
	OperatorValidity time.Duration
	Now              func() time.Time
}

func (i *Issuer) now() time.Time {
	if i.Now != nil {
		return i.Now()
	}
	return time.Now()
}

// Issue signs a certificate for id and builds the wire response parts.
func (i *Issuer) Issue(id pki.Identity, pub crypto.PublicKey, ips []net.IP, dns []string) (*Issued, error) {
	validity := i.AgentValidity
	if id.Role == pki.RoleOperator || id.Role == pki.RoleAdmin {
		validity = i.OperatorValidity
	}
	ca, chain := i.signer(), i.CAChain()
	if ca == nil {
		return nil, errors.New("registration: no CA to sign with")
	}
	cert, pemBytes, err := ca.IssueClient(pki.ClientRequest{Identity: id, PublicKey: pub, IPs: ips, DNSNames: dns, Validity: validity}, i.now())
	if err != nil {
		return nil, err
	}
	return &Issued{
		CertificatePEM: string(pemBytes),
		CAChainPEM:     string(chain),
		ExpiresAt:      timestamppb.New(cert.NotAfter),
		Identity:       ToProto(id),
		Serial:         cert.SerialNumber.String(),
		NotAfter:       cert.NotAfter,
	}, nil
}

// signer is the CA new certificates are signed with.
func (i *Issuer) signer() *pki.CA {
	if i.Trust != nil {
		return i.Trust.Signer()
	}
	return i.CA
}

// CAChain is the CA chain handed out with a certificate: every trusted CA
// (both during a CA rotation), so clients can verify servers of either.
func (i *Issuer) CAChain() []byte {
	if i.Trust != nil {
		return i.Trust.BundlePEM()
	}
	if i.CA != nil {
		return i.CA.CertPEM
	}
	return nil
}

// Issued is a freshly signed certificate.
type Issued struct {
	CertificatePEM string
	CAChainPEM     string
	ExpiresAt      *timestamppb.Timestamp
	Identity       *nstancev1.ClientIdentity
	Serial         string
	NotAfter       time.Time
}

// ToProto converts an identity to its wire form.
func ToProto(id pki.Identity) *nstancev1.ClientIdentity {
	role := nstancev1.ClientRole_CLIENT_ROLE_UNSPECIFIED
	switch id.Role {
	case pki.RoleAgent:
		role = nstancev1.ClientRole_CLIENT_ROLE_AGENT
	case pki.RoleOperator:
		role = nstancev1.ClientRole_CLIENT_ROLE_OPERATOR
	case pki.RoleAdmin:
		role = nstancev1.ClientRole_CLIENT_ROLE_ADMIN
	}
	return &nstancev1.ClientIdentity{
		ClientId: id.ClientID, Tenant: id.Tenant, ClusterId: id.ClusterID, Shard: id.Shard,
		Role: role, GroupId: id.Group, Uri: id.URI().String(),
	}
}

// NonceLeeway is the clock skew tolerated on a nonce's exp and nbf.
const NonceLeeway = 5 * time.Second

// Options are what one shard's Registration service is built from.
type Options struct {
	ClusterID, Shard string
	// ServerID names this server in nonce markers and operator records.
	ServerID string
	// Issuer signs the certificates.
	Issuer *Issuer
	// NonceKey verifies registration nonces (the cluster's nonce key).
	NonceKey ed25519.PublicKey
	// NonceMaxLifetime is the longest accepted nonce lifetime
	// (nonce.DefaultMaxLifetime when zero).
	NonceMaxLifetime time.Duration
	// Store holds the nonce markers and operator records.
	Store objstore.Store
	Keys  layout.Keys
	// Instances admits agents against their instance records; nil refuses
	// every agent.
	Instances *InstanceGate
	Log       logr.Logger
}

// New builds the Registration service of a shard: nonces verified with the
// cluster's nonce key (NonceLeeway of skew), spent in a create-only ledger
// in Store, certificates from Issuer. nstance-server and every test harness
// build it here.
func New(o Options) *Service {
	return &Service{
		Issuer: o.Issuer,
		Verifier: &nonce.Verifier{Key: o.NonceKey, ClusterID: o.ClusterID, Shard: o.Shard, Leeway: NonceLeeway,
			MaxLifetime: o.NonceMaxLifetime},
		Ledger:  &nonce.Ledger{Store: o.Store, Keys: o.Keys},
		Objects: o.Store, Keys: o.Keys, ServerID: o.ServerID,
		Instances: o.Instances, Log: o.Log,
	}
}

// Service implements nstancev1.RegistrationServiceServer.
type Service struct {
	nstancev1.UnimplementedRegistrationServiceServer

	Issuer   *Issuer
	Verifier *nonce.Verifier
	Ledger   *nonce.Ledger
	Objects  objstore.Store
	Keys     layout.Keys
	// ServerID names this server in nonce markers and operator records.
	ServerID string
	// Instances admits agents against their instance records; without it
	// every agent registration is refused.
	Instances *InstanceGate
	Log       logr.Logger
}

type fields struct {
	pub      crypto.PublicKey
	ips      []net.IP
	hostname string
}

func checkFields(nonceTok, keyPEM string, ips []string, hostname string) (*fields, error) {
	if nonceTok == "" {
		return nil, status.Error(codes.InvalidArgument, "nonce: required")
	}
	if len(nonceTok) > maxNonceLen {
		return nil, status.Errorf(codes.InvalidArgument, "nonce: longer than %d bytes", maxNonceLen)
	}
	if len(keyPEM) > maxKeyPEMLen {
		return nil, status.Errorf(codes.InvalidArgument, "public_key_pem: longer than %d bytes", maxKeyPEMLen)
	}
	pub, err := pki.ParseEd25519PublicKeyPEM([]byte(keyPEM))
	if err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "public_key_pem: %v", err)
	}
	if len(ips) > maxIPs {
		return nil, status.Errorf(codes.InvalidArgument, "ip_addresses: more than %d entries", maxIPs)
	}
	f := &fields{pub: pub, hostname: hostname}
	for i, s := range ips {
		ip := net.ParseIP(s)
		if ip == nil {
			return nil, status.Errorf(codes.InvalidArgument, "ip_addresses[%d]: %q is not an IP address", i, s)
		}
		f.ips = append(f.ips, ip)
	}
	if hostname != "" && (len(hostname) > maxHostLength || !hostnamePattern.MatchString(hostname)) {
		return nil, status.Errorf(codes.InvalidArgument, "hostname: %q is not a valid DNS name", hostname)
	}
	return f, nil
}

// Refusal messages. Registration callers are anonymous, so what they are
// told names no cluster, shard, tenant, instance or storage detail; the
// server log has the reason.
//
// The codes tell a client whether to retry:
//   - InvalidArgument: the request is malformed (definite).
//   - Unauthenticated: the nonce is forged, of another cluster or shard, or
//     expired (definite).
//   - AlreadyExists: the nonce was used with another key (definite).
//   - PermissionDenied: the instance may not register: no record, not in a
//     state that registers, registered with another key, or the caller's
//     source address is not the instance's (definite).
//   - FailedPrecondition: the nonce is not valid yet; the minting server's
//     clock is ahead of this one's (transient within a clock-skew bound).
//   - Unavailable: storage or the provider could not be reached (transient).
//   - Internal: signing failed (transient at best).
const (
	msgInvalidNonce = "registration refused: the nonce is not valid here"
	msgExpiredNonce = "registration refused: the nonce has expired"
	msgEarlyNonce   = "registration refused for now: the nonce is not valid yet (clock skew); retry shortly"
	msgUsedNonce    = "registration refused: the nonce has already been used"
	msgRefused      = "registration refused: this instance may not register"
	msgUnavailable  = "registration is unavailable right now; retry later"
	msgInternal     = "registration failed on the server"
)

// NonceStatus maps a nonce verification or ledger error to a gRPC status
// whose message is generic.
func NonceStatus(err error) error {
	switch {
	case errors.Is(err, nonce.ErrReplayed):
		return status.Error(codes.AlreadyExists, msgUsedNonce)
	case errors.Is(err, nonce.ErrNotYetValid):
		return status.Error(codes.FailedPrecondition, msgEarlyNonce)
	case errors.Is(err, nonce.ErrExpired):
		return status.Error(codes.Unauthenticated, msgExpiredNonce)
	case errors.Is(err, nonce.ErrMalformed), errors.Is(err, nonce.ErrAlgorithm), errors.Is(err, nonce.ErrSignature),
		errors.Is(err, nonce.ErrWrongCluster), errors.Is(err, nonce.ErrWrongKind), errors.Is(err, nonce.ErrWrongShard),
		errors.Is(err, nonce.ErrClaims), errors.Is(err, nonce.ErrLifetime):
		return status.Error(codes.Unauthenticated, msgInvalidNonce)
	default:
		return status.Error(codes.Unavailable, msgUnavailable)
	}
}

func gateStatus(err error) error {
	if errors.Is(err, nonce.ErrReplayed) {
		return NonceStatus(err)
	}
	if IsRefusal(err) {
		return status.Error(codes.PermissionDenied, msgRefused)
	}
	return status.Error(codes.Unavailable, msgUnavailable)
}

func peerAddr(ctx context.Context) string {
	if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
		return p.Addr.String()
	}
	return ""
}

func peerIP(ctx context.Context) netip.Addr {
	p, ok := peer.FromContext(ctx)
	if !ok || p.Addr == nil {
		return netip.Addr{}
	}
	if ta, ok := p.Addr.(*net.TCPAddr); ok {
		return ta.AddrPort().Addr().Unmap()
	}
	ap, err := netip.ParseAddrPort(p.Addr.String())
	if err != nil {
		return netip.Addr{}
	}
	return ap.Addr().Unmap()
}

// register verifies the nonce, admits agents against their instance record,
// issues, then consumes the nonce for the key: a request that is refused
// does not burn the nonce, and a retry with the same key after a lost reply
// gets the certificate stored with the nonce. Refusals are logged with their
// reason; the caller gets a generic status.
func (s *Service) register(ctx context.Context, kinds []nonce.Kind, tok, keyPEM string, ips []string, hostname string) (*Issued, *nonce.Claims, error) {
	f, err := checkFields(tok, keyPEM, ips, hostname)
	if err != nil {
		return nil, nil, err
	}
	claims, err := s.Verifier.Verify(tok, kinds...)
	if err != nil {
		s.Log.Info("registration refused", "kind", kinds[0], "peer", peerAddr(ctx), "reason", err.Error())
		return nil, nil, NonceStatus(err)
	}
	log := s.Log.WithValues("kind", claims.Kind, "jti", claims.ID, "subject", claims.Subject, "peer", peerAddr(ctx))
	fp, err := nonce.KeyFingerprint(f.pub)
	if err != nil {
		return nil, nil, status.Errorf(codes.InvalidArgument, "public_key_pem: %v", err)
	}
	role := pki.RoleAgent
	switch claims.Kind {
	case nonce.KindOperator:
		role = pki.RoleOperator
	case nonce.KindAdmin:
		role = pki.RoleAdmin
	}
	id := pki.Identity{ClusterID: s.Issuer.ClusterID, Tenant: claims.Tenant, Role: role, ClientID: claims.Subject, Shard: claims.Shard, Group: claims.Group}
	sanIPs, dns := f.ips, []string(nil)
	if f.hostname != "" {
		dns = []string{f.hostname}
	}
	if role == pki.RoleAgent {
		if s.Instances == nil {
			log.Info("registration refused", "reason", "this server keeps no instance records to admit agents against")
			return nil, nil, status.Error(codes.PermissionDenied, msgRefused)
		}
		adm, err := s.Instances.Admit(ctx, AdmitRequest{Claims: claims, KeySHA256: fp, Peer: peerIP(ctx), Hostname: f.hostname, IPs: f.ips})
		if err != nil {
			log.Info("registration refused", "reason", err.Error())
			return nil, nil, gateStatus(err)
		}
		// The certificate names what the server knows, never what was asked.
		sanIPs, dns = adm.IPs, adm.DNSNames
	}
	issued, err := s.Issuer.Issue(id, f.pub, sanIPs, dns)
	if err != nil {
		log.Error(err, "registration: issuing certificate")
		return nil, nil, status.Error(codes.Internal, msgInternal)
	}
	marker, err := s.Ledger.Consume(ctx, claims, nonce.Use{KeySHA256: fp, CertificatePEM: issued.CertificatePEM, UsedBy: s.ServerID, Now: s.Issuer.now()})
	if err != nil {
		log.Info("registration refused", "reason", err.Error())
		return nil, nil, NonceStatus(err)
	}
	if marker.CertificatePEM != issued.CertificatePEM {
		// A retry with the same key: answer with what was issued first.
		prior, err := s.Issuer.FromPEM(marker.CertificatePEM)
		if err != nil {
			log.Error(err, "registration: the certificate stored with the nonce is unusable")
			return nil, nil, status.Error(codes.Internal, msgInternal)
		}
		log.Info("registration retried with the same key; returning the certificate issued first", "serial", prior.Serial, "first_by", marker.UsedBy)
		issued = prior
	}
	if role == pki.RoleAgent {
		if err := s.Instances.Bind(ctx, BindRequest{Claims: claims, KeySHA256: fp, Serial: issued.Serial, ServerID: s.ServerID}); err != nil {
			// Not bound yet: a transient failure is retried by the agent
			// (same key, same certificate, bound then).
			log.Info("registration refused", "reason", err.Error())
			return nil, nil, gateStatus(err)
		}
	}
	return issued, claims, nil
}

// FromPEM rebuilds the wire parts of a certificate this issuer signed
// earlier (stored with its nonce).
func (i *Issuer) FromPEM(certPEM string) (*Issued, error) {
	cert, err := pki.ParseCertificatePEM([]byte(certPEM))
	if err != nil {
		return nil, err
	}
	id, err := pki.IdentityFromCert(cert, i.ClusterID)
	if err != nil {
		return nil, err
	}
	return &Issued{
		CertificatePEM: certPEM, CAChainPEM: string(i.CAChain()), ExpiresAt: timestamppb.New(cert.NotAfter),
		Identity: ToProto(id), Serial: cert.SerialNumber.String(), NotAfter: cert.NotAfter,
	}, nil
}

// RegisterAgent exchanges an agent nonce for an agent certificate.
func (s *Service) RegisterAgent(ctx context.Context, req *nstancev1.RegisterAgentRequest) (*nstancev1.RegisterAgentResponse, error) {
	issued, claims, err := s.register(ctx, []nonce.Kind{nonce.KindAgent}, req.GetNonce(), req.GetPublicKeyPem(), req.GetIpAddresses(), req.GetHostname())
	if err != nil {
		return nil, err
	}
	s.Log.Info("agent registered", "instance", claims.Subject, "tenant", claims.Tenant, "group", claims.Group, "serial", issued.Serial)
	return &nstancev1.RegisterAgentResponse{
		CertificatePem: issued.CertificatePEM, CaChainPem: issued.CAChainPEM, ExpiresAt: issued.ExpiresAt, Identity: issued.Identity,
	}, nil
}

// OperatorRecord is stored at cluster/operators/{tenant}/{id}.json for each
// registration (see ReadOperatorRecord for records of older versions).
type OperatorRecord struct {
	ID           string    `json:"id"`
	Tenant       string    `json:"tenant"`
	Role         string    `json:"role,omitempty"`
	URI          string    `json:"uri"`
	Serial       string    `json:"serial"`
	ExpiresAt    time.Time `json:"expires_at"`
	RegisteredAt time.Time `json:"registered_at"`
	RegisteredBy string    `json:"registered_by"`
	NonceID      string    `json:"nonce_id"`
}

// RegisterOperator exchanges an operator nonce for an operator certificate,
// or an admin nonce for an admin certificate.
func (s *Service) RegisterOperator(ctx context.Context, req *nstancev1.RegisterOperatorRequest) (*nstancev1.RegisterOperatorResponse, error) {
	issued, claims, err := s.register(ctx, []nonce.Kind{nonce.KindOperator, nonce.KindAdmin}, req.GetNonce(), req.GetPublicKeyPem(), req.GetIpAddresses(), req.GetHostname())
	if err != nil {
		return nil, err
	}
	rec := OperatorRecord{
		ID: claims.Subject, Tenant: claims.Tenant, Role: string(claims.Kind), URI: issued.Identity.GetUri(), Serial: issued.Serial,
		ExpiresAt: issued.NotAfter, RegisteredAt: s.Issuer.now().UTC(), RegisteredBy: s.ServerID, NonceID: claims.ID,
	}
	if s.Objects != nil {
		// Operator certificates are admitted only while their record exists,
		// so the record is part of the registration: without it the caller
		// retries with the same key and gets the same certificate (the
		// nonce marker holds it), written then. The record is the tenant's
		// own (cluster/operators/{tenant}/{id}.json): another tenant's
		// operator of the same id is not touched.
		if err := WriteOperatorRecord(ctx, s.Objects, s.Keys, rec); err != nil {
			s.Log.Error(err, "recording operator registration; the caller retries", "operator", claims.Subject, "tenant", claims.Tenant)
			return nil, status.Error(codes.Unavailable, "registration is unavailable right now; retry later")
		}
	}
	s.Log.Info("operator registered", "operator", claims.Subject, "tenant", claims.Tenant, "role", claims.Kind, "serial", issued.Serial)
	return &nstancev1.RegisterOperatorResponse{
		CertificatePem: issued.CertificatePEM, CaChainPem: issued.CAChainPEM, ExpiresAt: issued.ExpiresAt, Identity: issued.Identity,
	}, nil
}

// Renew issues a fresh certificate for an authenticated caller with the same
// identity and SANs as current, for a new public key (PEM) when given and
// otherwise for the key of current.
func (i *Issuer) Renew(id pki.Identity, current *x509.Certificate, newKeyPEM string) (*Issued, error) {
	var pub crypto.PublicKey
	if current != nil {
		pub = current.PublicKey
	}
	if newKeyPEM != "" {
		k, err := pki.ParseEd25519PublicKeyPEM([]byte(newKeyPEM))
		if err != nil {
			return nil, status.Errorf(codes.InvalidArgument, "public_key_pem: %v", err)
		}
		pub = k
	}
	if pub == nil {
		return nil, status.Error(codes.InvalidArgument, "public_key_pem: required (no key on the calling certificate)")
	}
	var ips []net.IP
	var dns []string
	if current != nil {
		ips, dns = current.IPAddresses, current.DNSNames
	}
	issued, err := i.Issue(id, pub, ips, dns)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "issuing certificate: %v", fmt.Errorf("renewal: %w", err))
	}
	return issued, nil
}

// RenewAgent issues a new identity certificate for the agent that presents
// leaf (a verified cluster-CA agent certificate) and now holds pub: the same
// identity (tenant, instance id, shard, group) and the same names (host name
// and addresses given at registration), a fresh validity.
func (i *Issuer) RenewAgent(leaf *x509.Certificate, pub crypto.PublicKey) (*Issued, error) {
	if leaf == nil {
		return nil, errors.New("renewal: no presented certificate")
	}
	id, err := pki.IdentityFromCert(leaf, i.ClusterID)
	if err != nil {
		return nil, fmt.Errorf("renewal: presented certificate: %w", err)
	}
	if id.Role != pki.RoleAgent {
		return nil, fmt.Errorf("renewal: role %q is not an agent", id.Role)
	}
	if _, ok := pub.(ed25519.PublicKey); !ok {
		return nil, fmt.Errorf("renewal: identity keys are Ed25519, not %T", pub)
	}
	return i.Issue(id, pub, leaf.IPAddresses, leaf.DNSNames)
}

// RenewAgentPEM is RenewAgent returning the certificate and CA chain PEM
// (the form agentapi.Options.RenewIdentity takes).
func (i *Issuer) RenewAgentPEM(_ context.Context, leaf *x509.Certificate, pub crypto.PublicKey) ([]byte, []byte, error) {
	issued, err := i.RenewAgent(leaf, pub)
	if err != nil {
		return nil, nil, err
	}
	return []byte(issued.CertificatePEM), []byte(issued.CAChainPEM), nil
}
