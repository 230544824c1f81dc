package auth

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"github.com/golang-jwt/jwt/v5"
	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/apiserver/pkg/apis/apiserver"
	"k8s.io/apiserver/pkg/authentication/authenticator"
	"k8s.io/apiserver/pkg/authentication/group"
	"k8s.io/apiserver/pkg/authentication/request/anonymous"
	"k8s.io/apiserver/pkg/authentication/request/bearertoken"
	"k8s.io/apiserver/pkg/authentication/request/union"
	"k8s.io/apiserver/pkg/authentication/serviceaccount"
	jwttoken "k8s.io/apiserver/pkg/authentication/token/jwt"
	"k8s.io/apiserver/pkg/authentication/token/tokenfile"
	tokenunion "k8s.io/apiserver/pkg/authentication/token/union"
	"k8s.io/apiserver/pkg/authentication/user"
)

const (
	// AdminUser and AdminGroup are the identity of the generated admin token.
	AdminUser  = "dev-k8s-admin"
	AdminGroup = user.SystemPrivilegedGroup
	// Audience is the audience (and issuer) of ServiceAccount tokens; a
	// token whose audiences do not include it is not accepted by the API,
	// as with kube-apiserver's --api-audiences.
	Audience = "https://kubernetes.default.svc.cluster.local"

	adminTokenFile = "admin.token"
	signingKeyFile = "service-account.key"
)

// AnonymousPaths are the only paths served without credentials, as
// kube-apiserver's default RBAC lets system:unauthenticated read them.
var AnonymousPaths = []string{"/healthz", "/livez", "/readyz", "/version"}

// ServiceAccounts resolves a ServiceAccount for token validation: its UID,
// and ok false when it does not exist or is being deleted.
type ServiceAccounts func(namespace, name string) (uid string, ok bool)

// Options configure an Authenticator.
type Options struct {
	// StateDir keeps the admin token and the ServiceAccount signing key
	// (created when missing, mode 0600).
	StateDir string
	// TokenFile is an optional kube-apiserver static token file:
	// token,user,uid,"group1,group2" per line.
	TokenFile string
	// ServiceAccounts looks ServiceAccounts up when a token is checked.
	ServiceAccounts ServiceAccounts
	// ClientCAFile turns on client certificate authentication (as
	// kube-apiserver's --client-ca-file): a certificate that verifies
	// against this PEM bundle authenticates as its CommonName with its
	// Organizations as groups. The file is reloaded when it changes, and
	// one that does not exist yet is waited for.
	ClientCAFile string
	// Log receives the client CA file's progress.
	Log logr.Logger
	// ClientCAPoll is how often a missing client CA file is looked for
	// (default one second).
	ClientCAPoll time.Duration
}

// Authenticator checks bearer tokens and issues ServiceAccount tokens.
type Authenticator struct {
	adminToken string
	key        []byte
	sa         ServiceAccounts
	request    authenticator.Request
	methods    []string
}

// New loads (or creates) the admin token and signing key, reads the token
// file and starts watching the client CA file; the watch ends with ctx.
func New(ctx context.Context, opts Options) (*Authenticator, error) {
	if opts.StateDir == "" {
		return nil, errors.New("auth: state directory is empty")
	}
	if err := os.MkdirAll(opts.StateDir, 0o700); err != nil {
		return nil, fmt.Errorf("create %s: %w", opts.StateDir, err)
	}
	admin, err := loadOrCreateSecret(filepath.Join(opts.StateDir, adminTokenFile))
	if err != nil {
		return nil, fmt.Errorf("admin token: %w", err)
	}
	keyText, err := loadOrCreateSecret(filepath.Join(opts.StateDir, signingKeyFile))
	if err != nil {
		return nil, fmt.Errorf("service account signing key: %w", err)
	}
	key, err := base64.RawURLEncoding.DecodeString(keyText)
	if err != nil || len(key) < 32 {
		return nil, fmt.Errorf("service account signing key %s is not 32+ bytes of base64url; delete it to generate a new one", filepath.Join(opts.StateDir, signingKeyFile))
	}
	a := &Authenticator{adminToken: admin, key: key, sa: opts.ServiceAccounts, methods: []string{"admin token"}}
	tokens := []authenticator.Token{
		tokenfile.New(map[string]*user.DefaultInfo{admin: {Name: AdminUser, UID: AdminUser, Groups: []string{AdminGroup}}}),
	}
	if opts.TokenFile != "" {
		static, err := readTokenFile(opts.TokenFile)
		if err != nil {
			return nil, err
		}
		tokens = append(tokens, static)
		a.methods = append(a.methods, "token file "+opts.TokenFile)
	}
	tokens = append(tokens, authenticator.TokenFunc(a.authenticateServiceAccount))
	a.methods = append(a.methods, "service account tokens")
	// kube-apiserver tries client certificates first, then bearer tokens,
	// and takes the first that authenticates: a request whose certificate
	// does not verify still authenticates with a good token, and fails
	// (401) without one.
	var chain []authenticator.Request
	if opts.ClientCAFile != "" {
		if opts.ClientCAPoll <= 0 {
			opts.ClientCAPoll = time.Second
		}
		ca, err := startClientCA(ctx, opts.Log, opts.ClientCAFile, opts.ClientCAPoll)
		if err != nil {
			return nil, err
		}
		chain = append(chain, ca.authenticator())
		a.methods = append(a.methods, "x509 client certificates (CA file "+opts.ClientCAFile+")")
	}
	chain = append(chain, bearertoken.New(tokenunion.New(tokens...)))
	conditions := make([]apiserver.AnonymousAuthCondition, len(AnonymousPaths))
	for i, p := range AnonymousPaths {
		conditions[i] = apiserver.AnonymousAuthCondition{Path: p}
	}
	// The same chain kube-apiserver builds: certificates and bearer
	// tokens, then system:authenticated added, then anonymous only where
	// allowed and never for a request that presented a bad credential.
	a.request = union.NewFailOnError(
		group.NewAuthenticatedGroupAdder(union.New(chain...)),
		anonymous.NewAuthenticator(conditions),
	)
	return a, nil
}

// Methods names the authenticators that are on, for the start-up summary.
func (a *Authenticator) Methods() []string { return append([]string(nil), a.methods...) }

// readTokenFile parses the static token file, refusing an unreadable or
// malformed one with the line that is wrong.
func readTokenFile(path string) (authenticator.Token, error) {
	if _, err := os.Stat(path); err != nil {
		return nil, fmt.Errorf("token file: %w", err)
	}
	static, err := tokenfile.NewCSV(path)
	if err != nil {
		return nil, fmt.Errorf("token file %s: %w", path, err)
	}
	return static, nil
}

// loadOrCreateSecret reads a one-line secret, writing 32 random bytes
// (base64url) when the file does not exist.
func loadOrCreateSecret(path string) (string, error) {
	data, err := os.ReadFile(path)
	if err == nil {
		s := strings.TrimSpace(string(data))
		if s == "" {
			return "", fmt.Errorf("%s is empty; delete it to generate a new one", path)
		}
		return s, nil
	}
	if !errors.Is(err, os.ErrNotExist) {
		return "", fmt.Errorf("read %s: %w", path, err)
	}
	buf := make([]byte, 32)
	if _, err := rand.Read(buf); err != nil {
		return "", fmt.Errorf("generate %s: %w", path, err)
	}
	s := base64.RawURLEncoding.EncodeToString(buf)
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return "", fmt.Errorf("create %s: %w", path, err)
	}
	if _, err := f.WriteString(s + "\n"); err != nil {
		_ = f.Close()
		return "", fmt.Errorf("write %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return "", fmt.Errorf("write %s: %w", path, err)
	}
	return s, nil
}

// AdminToken is the token written into the generated kubeconfig.
func (a *Authenticator) AdminToken() string { return a.adminToken }

// Authenticate returns the user of a request. An error means the request
// must be answered 401 Unauthorized.
func (a *Authenticator) Authenticate(r *http.Request) (user.Info, error) {
	resp, ok, err := a.request.AuthenticateRequest(r)
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, errors.New("no credentials")
	}
	return resp.User, nil
}

type userKey struct{}

// WithUser stores the authenticated user in ctx.
func WithUser(ctx context.Context, u user.Info) context.Context {
	return context.WithValue(ctx, userKey{}, u)
}

// UserFrom returns the user stored by WithUser.
func UserFrom(ctx context.Context) (user.Info, bool) {
	u, ok := ctx.Value(userKey{}).(user.Info)
	return u, ok
}

// saClaims are the claims of a ServiceAccount token, shaped like those
// kube-apiserver issues.
type saClaims struct {
	jwt.RegisteredClaims
	Kubernetes struct {
		Namespace      string `json:"namespace"`
		ServiceAccount struct {
			Name string `json:"name"`
			UID  string `json:"uid"`
		} `json:"serviceaccount"`
	} `json:"kubernetes.io"`
}

// IssueServiceAccountToken signs a token for a ServiceAccount that is valid
// from now until exp for the given audiences.
func (a *Authenticator) IssueServiceAccountToken(namespace, name, uid string, audiences []string, now, exp time.Time) (string, error) {
	var c saClaims
	c.Issuer = Audience
	c.Subject = serviceaccount.MakeUsername(namespace, name)
	c.Audience = audiences
	c.IssuedAt = jwt.NewNumericDate(now)
	c.NotBefore = jwt.NewNumericDate(now)
	c.ExpiresAt = jwt.NewNumericDate(exp)
	c.ID = string(uuid.NewUUID())
	c.Kubernetes.Namespace = namespace
	c.Kubernetes.ServiceAccount.Name = name
	c.Kubernetes.ServiceAccount.UID = uid
	tok, err := jwt.NewWithClaims(jwt.SigningMethodHS256, c).SignedString(a.key)
	if err != nil {
		return "", fmt.Errorf("sign service account token: %w", err)
	}
	return tok, nil
}

// authenticateServiceAccount accepts a token this server issued that is
// current, meant for the API audience, and whose ServiceAccount still
// exists with the same UID.
func (a *Authenticator) authenticateServiceAccount(_ context.Context, token string) (*authenticator.Response, bool, error) {
	if strings.Count(token, ".") != 2 {
		return nil, false, nil // not a JWT: another authenticator's token, or none
	}
	var c saClaims
	_, err := jwt.ParseWithClaims(token, &c, func(*jwt.Token) (any, error) { return a.key, nil },
		jwt.WithValidMethods([]string{jwt.SigningMethodHS256.Alg()}),
		jwt.WithIssuer(Audience),
		jwt.WithAudience(Audience),
		jwt.WithExpirationRequired(),
	)
	if err != nil {
		return nil, false, fmt.Errorf("service account token: %w", err)
	}
	ns, name := c.Kubernetes.Namespace, c.Kubernetes.ServiceAccount.Name
	if ns == "" || name == "" || c.Subject != serviceaccount.MakeUsername(ns, name) {
		return nil, false, errors.New("service account token: malformed claims")
	}
	if a.sa == nil {
		return nil, false, errors.New("service account token: no service account lookup")
	}
	uid, ok := a.sa(ns, name)
	if !ok {
		return nil, false, fmt.Errorf("service account token: service account %s/%s has been deleted", ns, name)
	}
	if uid != c.Kubernetes.ServiceAccount.UID {
		return nil, false, fmt.Errorf("service account token: service account %s/%s UID %s does not match the token's", ns, name, uid)
	}
	info := serviceaccount.ServiceAccountInfo{Name: name, Namespace: ns, UID: uid}
	info.CredentialID = jwttoken.CredentialIDForJTI(c.ID)
	return &authenticator.Response{User: info.UserInfo(), Audiences: authenticator.Audiences{Audience}}, true, nil
}
