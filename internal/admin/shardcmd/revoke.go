package shardcmd

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/nstance-dev/nstance/internal/admin/output"
	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

var reasonFlag = &cli.StringFlag{Name: "reason", Usage: "why; recorded with the revocation"}

// clusterCall runs fn on one shard: operator records and their revocations
// are cluster-wide, so any shard answers for the cluster (the first of the
// selection, --shard picks one).
func (s *session) clusterCall(fn func(ctx context.Context, n string, oc nstancev1.OperatorServiceClient) error) error {
	if len(s.names) == 0 {
		return errors.New("no shard configured")
	}
	n := s.names[0]
	oc, err := s.set.Client(n)
	if err != nil {
		return err
	}
	if err := s.call(func(ctx context.Context) error { return fn(ctx, n, oc) }); err != nil {
		return fmt.Errorf("shard %s: %w", n, err)
	}
	return nil
}

func roleName(r nstancev1.ClientRole) string {
	return strings.ToLower(strings.TrimPrefix(r.String(), "CLIENT_ROLE_"))
}

func kindName(k nstancev1.RevocationKind) string {
	return strings.ToLower(strings.TrimPrefix(k.String(), "REVOCATION_KIND_"))
}

func operatorCommand() *cli.Command {
	return &cli.Command{
		Name:  "operator",
		Usage: "registered operators and admins of the cluster (admin certificate required)",
		Subcommands: []*cli.Command{
			{
				Name: "list", Usage: "list the registered operators and admins (the issued control-plane identities)", Flags: flags(false),
				Action: func(c *cli.Context) error {
					return run(c, false, func(s *session) error {
						return s.clusterCall(func(ctx context.Context, n string, oc nstancev1.OperatorServiceClient) error {
							resp, err := oc.ListOperators(ctx, &nstancev1.ListOperatorsRequest{})
							if err != nil {
								return err
							}
							var it items
							rows := output.Rows{Header: []string{"OPERATOR", "TENANT", "ROLE", "SERIAL", "EXPIRES", "REGISTERED", "BY"}}
							for _, o := range resp.GetOperators() {
								rows.Add(o.GetOperatorId(), o.GetTenant(), roleName(o.GetRole()), orDash(o.GetSerial()),
									timeString(o.GetExpiresAt()), timeString(o.GetRegisteredAt()), orDash(o.GetRegisteredBy()))
								if err := it.add(n, o); err != nil {
									return err
								}
							}
							if s.p.Machine() {
								return it.print(s.p, nil)
							}
							return s.p.Table(rows)
						})
					})
				},
			},
			{
				Name: "revoke", Usage: "revoke an operator or admin of one tenant: its record is deleted and its certificates are refused on every shard from the next handshake and call (the same id in another tenant is someone else)",
				ArgsUsage: "OPERATOR", Flags: flags(false, reasonFlag, &cli.StringFlag{Name: "tenant", Usage: "tenant of OPERATOR; required when the id is registered in several tenants or none"}),
				Action: func(c *cli.Context) error {
					id, err := oneArg(c, "OPERATOR")
					if err != nil {
						return err
					}
					return run(c, false, func(s *session) error {
						return s.clusterCall(func(ctx context.Context, n string, oc nstancev1.OperatorServiceClient) error {
							resp, err := oc.Revoke(ctx, &nstancev1.RevokeRequest{Target: &nstancev1.RevokeRequest_OperatorId{OperatorId: id}, Tenant: c.String("tenant"), Reason: c.String("reason")})
							if err != nil {
								return err
							}
							return s.printRevocation(n, resp.GetRevocation())
						})
					})
				},
			},
		},
	}
}

var revocationHeader = []string{"SHARD", "KIND", "SUBJECT", "SERIAL", "REVOKED", "EXPIRES", "BY", "REASON"}

func revocationCommand() *cli.Command {
	return &cli.Command{
		Name:  "revocation",
		Usage: "the deny list of control-plane certificates (admin certificate required)",
		Subcommands: []*cli.Command{
			{
				Name: "list", Usage: "list the revocations each shard enforces (the cluster's and its own)", Flags: flags(true),
				Action: func(c *cli.Context) error {
					return run(c, true, func(s *session) error {
						rows := output.Rows{Header: revocationHeader}
						var it items
						err := s.forEach(func(ctx context.Context, n string, oc nstancev1.OperatorServiceClient) error {
							resp, err := oc.ListRevocations(ctx, &nstancev1.ListRevocationsRequest{})
							if err != nil {
								return err
							}
							for _, r := range resp.GetRevocations() {
								rows.Add(revocationRow(n, r)...)
								if err := it.add(n, r); err != nil {
									return err
								}
							}
							return nil
						})
						if s.p.Machine() {
							return it.print(s.p, err)
						}
						return errors.Join(err, s.p.Table(rows))
					})
				},
			},
			{
				Name: "add", Usage: "revoke one certificate by its serial number (decimal), on every shard", ArgsUsage: "SERIAL", Flags: flags(false, reasonFlag),
				Action: func(c *cli.Context) error {
					serial, err := oneArg(c, "SERIAL")
					if err != nil {
						return err
					}
					return run(c, false, func(s *session) error {
						return s.clusterCall(func(ctx context.Context, n string, oc nstancev1.OperatorServiceClient) error {
							resp, err := oc.Revoke(ctx, &nstancev1.RevokeRequest{Target: &nstancev1.RevokeRequest_Serial{Serial: serial}, Reason: c.String("reason")})
							if err != nil {
								return err
							}
							return s.printRevocation(n, resp.GetRevocation())
						})
					})
				},
			},
		},
	}
}

// instanceRevokeCommand is `instance revoke`.
func instanceRevokeCommand() *cli.Command {
	return &cli.Command{
		Name: "revoke", Usage: "refuse the agent certificates of an instance from its next handshake and call (the instance stays; it is replaced once unhealthy)",
		ArgsUsage: "INSTANCE", Flags: flags(false, reasonFlag),
		Action: func(c *cli.Context) error {
			return onInstance(c, func(s *session, n string, oc nstancev1.OperatorServiceClient, id string) error {
				return s.call(func(ctx context.Context) error {
					resp, err := oc.Revoke(ctx, &nstancev1.RevokeRequest{Target: &nstancev1.RevokeRequest_InstanceId{InstanceId: id}, Reason: c.String("reason")})
					if err != nil {
						return fmt.Errorf("shard %s: %w", n, err)
					}
					return s.printRevocation(n, resp.GetRevocation())
				})
			})
		},
	}
}

func revocationRow(n string, r *nstancev1.Revocation) []string {
	subject := r.GetSubject()
	if r.GetShard() != "" {
		subject = r.GetShard() + "/" + subject
	}
	if r.GetTenant() != "" {
		subject = r.GetTenant() + "/" + subject
	}
	return []string{n, kindName(r.GetKind()), orDash(subject), orDash(r.GetSerial()), timeString(r.GetRevokedAt()),
		timeString(r.GetExpiresAt()), orDash(r.GetRevokedBy()), orDash(r.GetReason())}
}

func (s *session) printRevocation(n string, r *nstancev1.Revocation) error {
	if s.p.Machine() {
		obj, err := output.ShardProto(n, r)
		if err != nil {
			return err
		}
		return s.p.Document(obj)
	}
	row := revocationRow(n, r)
	return s.p.Fields("shard", n, "kind", row[1], "subject", row[2], "serial", row[3], "uri", orDash(r.GetUri()),
		"issued before", timeString(r.GetIssuedBefore()), "revoked", row[4], "expires", row[5], "by", row[6], "reason", row[7])
}
