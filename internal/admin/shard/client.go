package shard

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"sort"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/nstance-dev/nstance/internal/layout"
	"github.com/nstance-dev/nstance/internal/msgsize"
	"github.com/nstance-dev/nstance/internal/pki"
	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

// ParseServers parses "shard=host:port,shard2=host:port".
func ParseServers(s string) (map[string]string, error) {
	out := map[string]string{}
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		name, addr, ok := strings.Cut(part, "=")
		if !ok {
			return nil, fmt.Errorf("--servers: %q is not shard=host:port", part)
		}
		if err := ValidateServer(name, addr); err != nil {
			return nil, fmt.Errorf("--servers: %w", err)
		}
		if _, dup := out[name]; dup {
			return nil, fmt.Errorf("--servers: shard %s listed twice", name)
		}
		out[name] = addr
	}
	if len(out) == 0 {
		return nil, errors.New("--servers: no shard given")
	}
	return out, nil
}

// ValidateServer checks one shard=host:port entry.
func ValidateServer(shard, addr string) error {
	if err := layout.ValidateID("shard id", shard); err != nil {
		return err
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("shard %s: %w", shard, err)
	}
	if host == "" || port == "" {
		return fmt.Errorf("shard %s: %q is not host:port", shard, addr)
	}
	return nil
}

// FormatServers is the inverse of ParseServers, sorted by shard.
func FormatServers(servers map[string]string) string {
	parts := make([]string, 0, len(servers))
	for _, name := range sortedKeys(servers) {
		parts = append(parts, name+"="+servers[name])
	}
	return strings.Join(parts, ",")
}

// Credentials are the operator certificate files.
type Credentials struct {
	CACertFile, CertFile, KeyFile string
}

// TLSConfig loads the files into a client TLS config.
func (c Credentials) TLSConfig() (*tls.Config, error) {
	if c.CACertFile == "" || c.CertFile == "" || c.KeyFile == "" {
		return nil, errors.New("--ca-cert, --cert and --key are required (operator certificate from registration)")
	}
	caPEM, err := os.ReadFile(c.CACertFile)
	if err != nil {
		return nil, fmt.Errorf("reading CA: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return nil, fmt.Errorf("%s holds no PEM certificate", c.CACertFile)
	}
	pair, err := tls.LoadX509KeyPair(c.CertFile, c.KeyFile)
	if err != nil {
		return nil, fmt.Errorf("loading operator certificate: %w", err)
	}
	return &tls.Config{MinVersion: tls.VersionTLS13, RootCAs: pool, Certificates: []tls.Certificate{pair}, VerifyConnection: pki.VerifyServerConnection}, nil
}

// Set is a set of shard connections.
type Set struct {
	names   []string
	clients map[string]nstancev1.OperatorServiceClient
	conns   []*grpc.ClientConn
}

// Dial connects to the given shards (connections are lazy; errors show on
// first call). Each server must carry the server identity of the shard it is
// named for in servers.
func Dial(servers map[string]string, tc *tls.Config) (*Set, error) {
	s := &Set{clients: map[string]nstancev1.OperatorServiceClient{}}
	for _, name := range sortedKeys(servers) {
		addr := servers[name]
		cfg := tc.Clone()
		// The server at addr must serve the shard it is named for.
		cfg.VerifyConnection = pki.VerifyServerOfShard(name)
		if host, _, err := net.SplitHostPort(addr); err == nil && cfg.ServerName == "" {
			cfg.ServerName = host
		}
		conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(cfg)), msgsize.DialOption())
		if err != nil {
			s.Close()
			return nil, fmt.Errorf("shard %s: %w", name, err)
		}
		s.conns = append(s.conns, conn)
		s.clients[name] = nstancev1.NewOperatorServiceClient(conn)
		s.names = append(s.names, name)
	}
	return s, nil
}

func sortedKeys[V any](m map[string]V) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}

// Close closes every connection.
func (s *Set) Close() {
	for _, c := range s.conns {
		c.Close()
	}
}

// Names returns the shard names, sorted.
func (s *Set) Names() []string { return append([]string{}, s.names...) }

// Client returns the client of one shard.
func (s *Set) Client(shard string) (nstancev1.OperatorServiceClient, error) {
	c, ok := s.clients[shard]
	if !ok {
		return nil, fmt.Errorf("unknown shard %q (known: %s)", shard, strings.Join(s.names, ", "))
	}
	return c, nil
}

// Select resolves --shard / --all-shards into shard names.
func (s *Set) Select(shard string, all bool) ([]string, error) {
	switch {
	case shard != "" && all:
		return nil, errors.New("use either --shard or --all-shards, not both")
	case all:
		return s.Names(), nil
	case shard != "":
		if _, err := s.Client(shard); err != nil {
			return nil, err
		}
		return []string{shard}, nil
	case len(s.names) == 1:
		return s.Names(), nil
	}
	return nil, errors.New("several shards configured: pass --shard NAME or --all-shards")
}

// FindGroup returns one group of a shard, or nil.
func FindGroup(ctx context.Context, c nstancev1.OperatorServiceClient, id string) (*nstancev1.GroupStatus, error) {
	resp, err := c.ListGroups(ctx, &nstancev1.ListGroupsRequest{})
	if err != nil {
		return nil, err
	}
	for _, g := range resp.GetGroups() {
		if g.GetSpec().GetGroupId() == id {
			return g, nil
		}
	}
	return nil, nil
}

// Scale changes only the size of a group, guarded by its etag.
func Scale(ctx context.Context, c nstancev1.OperatorServiceClient, id string, size uint32) (*nstancev1.GroupStatus, error) {
	g, err := FindGroup(ctx, c, id)
	if err != nil {
		return nil, err
	}
	if g == nil {
		return nil, fmt.Errorf("group %q not found", id)
	}
	spec := g.GetSpec()
	spec.Size = size
	resp, err := c.UpsertGroup(ctx, &nstancev1.UpsertGroupRequest{Group: spec, ExpectedEtag: g.GetEtag()})
	if err != nil {
		return nil, err
	}
	return resp.GetGroup(), nil
}
