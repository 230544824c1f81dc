package attack

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

// limitCases are the cases of issue 29 about value lengths, tenant totals, per-listener message limits, anonymous /metrics (findings 3, 4 and 9).
func limitCases() []attackCase {
	return []attackCase{
		{name: "group var value over max_var_value_bytes refused naming the limit", run: bigGroupVar},
		{name: "on-demand instance label value over max_label_value_bytes refused naming the limit", run: bigInstanceLabel},
		{name: "a tenant's groups beyond max_tenant_group_bytes refused", run: tenantGroupBytes},
		{name: "one anonymous registration connection with 32 partial 15 MiB messages holds under 8 MiB", run: registrationPartialMessages},
		{name: "anonymous /metrics names no tenant or group", run: anonymousMetrics},
	}
}

// Default shard.limits the cases run against (internal/config/limits.go).
const (
	defaultVarValueBytes    = 4 << 10
	defaultTenantGroupBytes = 1 << 20
)

// refusedNaming checks err is code and its message names every one of words.
func refusedNaming(what string, err error, code codes.Code, words ...string) error {
	if status.Code(err) != code {
		return fmt.Errorf("%s: want %v, got %v", what, code, err)
	}
	for _, w := range words {
		if !strings.Contains(status.Convert(err).Message(), w) {
			return fmt.Errorf("%s: refusal does not name %q: %v", what, w, err)
		}
	}
	return nil
}

// groupExists reports whether tenant A's group id is stored.
func groupExists(ctx context.Context, c nstancev1.OperatorServiceClient, id string) (bool, error) {
	gs, err := c.ListGroups(ctx, &nstancev1.ListGroupsRequest{})
	if err != nil {
		return false, err
	}
	for _, g := range gs.Groups {
		if g.GetSpec().GetGroupId() == id {
			return true, nil
		}
	}
	return false, nil
}

// bigGroupVar: a 64 KiB var value is refused with InvalidArgument naming
// the key, the limit and its value; nothing is stored.
func bigGroupVar(ctx context.Context, e *env) error {
	c := nstancev1.NewOperatorServiceClient(e.connA)
	vars := map[string]string{"blob": strings.Repeat("x", 64<<10)}
	_, err := c.UpsertGroup(ctx, &nstancev1.UpsertGroupRequest{Group: &nstancev1.GroupSpec{GroupId: "bigvar", Template: "svc", Size: 0, Vars: vars}})
	if err == nil {
		_, _ = c.DeleteGroup(ctx, &nstancev1.DeleteGroupRequest{GroupId: "bigvar"})
	}
	if err := refusedNaming("UpsertGroup", err, codes.InvalidArgument, "shard.limits.max_var_value_bytes", fmt.Sprint(defaultVarValueBytes), "blob"); err != nil {
		return err
	}
	if ok, err := groupExists(ctx, c, "bigvar"); err != nil || ok {
		return fmt.Errorf("the refused group is stored (%v)", err)
	}
	return nil
}

// bigInstanceLabel: CreateInstance with a 64 KiB label value is refused
// naming the limit and the label; no instance is created.
func bigInstanceLabel(ctx context.Context, e *env) error {
	c := nstancev1.NewOperatorServiceClient(e.connA)
	before, err := c.ListInstances(ctx, &nstancev1.ListInstancesRequest{})
	if err != nil {
		return err
	}
	resp, err := c.CreateInstance(ctx, &nstancev1.CreateInstanceRequest{Template: "svc", ClientToken: "big-label",
		Labels: map[string]string{"blob": strings.Repeat("y", 64<<10)}})
	if id := resp.GetInstance().GetInstanceId(); id != "" {
		_, _ = c.DeleteInstance(ctx, &nstancev1.DeleteInstanceRequest{InstanceId: id, SkipDrain: true})
	}
	if err := refusedNaming("CreateInstance", err, codes.InvalidArgument, "shard.limits.max_label_value_bytes", "blob"); err != nil {
		return err
	}
	after, err := c.ListInstances(ctx, &nstancev1.ListInstancesRequest{})
	if err != nil {
		return err
	}
	if len(after.Instances) != len(before.Instances) {
		return fmt.Errorf("tenant A had %d instances, now %d", len(before.Instances), len(after.Instances))
	}
	return nil
}

// tenantGroupBytes: tenant A upserts groups of 63 vars at the largest value
// (about 252 KiB each) until the shard refuses one with
// ResourceExhausted naming max_tenant_group_bytes; at most the limit is
// stored and the refused group is not. Tenant B can still upsert.
func tenantGroupBytes(ctx context.Context, e *env) error {
	c := nstancev1.NewOperatorServiceClient(e.connA)
	vars := map[string]string{}
	const perGroup = 63
	for i := range perGroup {
		vars[fmt.Sprintf("v%02d", i)] = strings.Repeat("z", defaultVarValueBytes)
	}
	var made []string
	defer func() {
		for _, id := range made {
			_, _ = c.DeleteGroup(context.WithoutCancel(ctx), &nstancev1.DeleteGroupRequest{GroupId: id})
		}
	}()
	var refused error
	for i := range 10 {
		id := fmt.Sprintf("full%d", i)
		_, err := c.UpsertGroup(ctx, &nstancev1.UpsertGroupRequest{Group: &nstancev1.GroupSpec{GroupId: id, Template: "svc", Size: 0, Vars: vars}})
		if err != nil {
			refused = err
			if ok, lerr := groupExists(ctx, c, id); lerr != nil || ok {
				return fmt.Errorf("the refused group %s is stored (%v)", id, lerr)
			}
			break
		}
		made = append(made, id)
	}
	if refused == nil {
		return fmt.Errorf("tenant A stored %d groups of %d KiB each, nothing refused", len(made), perGroup*defaultVarValueBytes>>10)
	}
	if err := refusedNaming("UpsertGroup", refused, codes.ResourceExhausted, "shard.limits.max_tenant_group_bytes", fmt.Sprint(defaultTenantGroupBytes)); err != nil {
		return err
	}
	if len(made)*perGroup*defaultVarValueBytes > defaultTenantGroupBytes || len(made) < 3 {
		return fmt.Errorf("%d groups of %d KiB admitted before the refusal", len(made), perGroup*defaultVarValueBytes>>10)
	}
	b := nstancev1.NewOperatorServiceClient(e.connB)
	if _, err := b.UpsertGroup(ctx, &nstancev1.UpsertGroupRequest{Group: &nstancev1.GroupSpec{GroupId: "bsmall", Template: "svc", Size: 0}}); err != nil {
		return fmt.Errorf("tenant B's upsert while A is at its limit: %v", err)
	}
	_, _ = b.DeleteGroup(ctx, &nstancev1.DeleteGroupRequest{GroupId: "bsmall"})
	return nil
}

// registrationPartialMessages: one anonymous connection to the
// Registration listener opens 32 RegisterAgent streams, each announcing a
// 15 MiB message and sending all of it the server's flow control admits but
// the last byte. The server's RSS, read while the connection stays open,
// grows by less than 8 MiB, and the listener still answers.
func registrationPartialMessages(ctx context.Context, e *env) error {
	const streams, msg, bound = 32, 15 << 20, 8 << 20
	pid := e.dev1.proc.Cmd.Process.Pid
	before, err := rss(pid)
	if err != nil {
		return err
	}
	f, err := dialFlood(e.dev1.registration)
	if err != nil {
		return err
	}
	defer f.Close()
	r, err := f.run(ctx, nstancev1.RegistrationService_RegisterAgent_FullMethodName, streams, msg, 3*time.Second)
	if err != nil {
		return err
	}
	after, err := rss(pid)
	if err != nil {
		return err
	}
	grew := after - before
	fmt.Printf("     registration flood: %d streams sent %d KiB, %d reset, %d answered; server RSS %d -> %d MiB (grew %.1f MiB)\n",
		streams, r.sent>>10, r.resets, r.answered, before>>20, after>>20, float64(grew)/(1<<20))
	if grew > bound {
		return fmt.Errorf("server RSS grew %.1f MiB (bound %d MiB) while one anonymous connection held %d partial messages (%d MiB sent)",
			float64(grew)/(1<<20), bound>>20, streams, r.sent>>20)
	}
	// The listener still serves: an empty registration is refused, not dropped.
	conn, err := e.l.dial(e.dev1.registration, nil)
	if err != nil {
		return err
	}
	defer conn.Close()
	_, err = nstancev1.NewRegistrationServiceClient(conn).RegisterAgent(ctx, &nstancev1.RegisterAgentRequest{})
	if c := status.Code(err); c == codes.Unavailable || c == codes.OK || c == codes.DeadlineExceeded {
		return fmt.Errorf("registration listener after the flood: %v", err)
	}
	return nil
}

// labelled matches a series that carries a tenant or group label.
var labelled = regexp.MustCompile(`(?m)^nstance_\w+\{[^}]*\b(tenant|group)="`)

// anonymousMetrics: /metrics on the health port, scraped without
// credentials, names no tenant or group (tenant B's instance runs, tenant A
// has groups), yet still reports the fleet in aggregate.
func anonymousMetrics(ctx context.Context, e *env) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+e.dev1.health+"/metrics", nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("/metrics: %s", resp.Status)
	}
	if m := labelled.FindAll(body, 3); len(m) > 0 {
		return fmt.Errorf("anonymous /metrics names tenants or groups, e.g. %q", m)
	}
	for _, tenant := range []string{tenantB, groupB} {
		if strings.Contains(string(body), `"`+tenant+`"`) {
			return fmt.Errorf("anonymous /metrics names %q", tenant)
		}
	}
	if !regexp.MustCompile(`(?m)^nstance_server_instances\{state="running"\} [1-9]`).Match(body) {
		return errors.New("anonymous /metrics lacks the aggregated count of running instances")
	}
	return nil
}
