package attack

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/nstance-dev/nstance/internal/testing/proctest"
	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

// tenancyCases are the cases of issue 29 about templates per tenant and a workload CA per tenant.
func tenancyCases() []attackCase {
	return []attackCase{
		{name: "tenant A's workload certificate for tenant B's service name is not trusted by tenant B's instance's CA bundle", run: crossTenantWorkloadTrust},
		{name: "tenant A cannot create a group or instance from a template restricted to tenant B", run: restrictedTemplate},
		{name: "a config naming two tenants with a template that lists none is refused", run: templateWithoutTenants},
	}
}

// svcName is the DNS name template "svc" gives tenant B's instance (the
// default of var san_dns).
const svcName = "svc.workload.test"

// instanceFile reads a file an agent of dev-1 wrote (relative to its
// instance directory).
func (e *env) instanceFile(id, rel string) ([]byte, error) {
	return os.ReadFile(filepath.Join(e.s.stateDir(e.dev1), id, filepath.FromSlash(rel)))
}

// crossTenantWorkloadTrust: tenant A asks for a workload certificate with
// tenant B's service name (its own instance of the shared template "svc",
// vars naming B's service). Tenant B's instance trusts what its ca_bundle
// file (files/ca.crt, read from its disk) holds; A's certificate must not
// verify against it, while B's own certificate does.
func crossTenantWorkloadTrust(ctx context.Context, e *env) error {
	bundle, err := e.instanceFile(e.instB, "files/ca.crt")
	if err != nil {
		return fmt.Errorf("reading tenant B's CA bundle: %w", err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(bundle) {
		return errors.New("tenant B's CA bundle holds no certificate")
	}
	own, err := parsePEMCert(e.svcBPEM)
	if err != nil {
		return err
	}
	if _, err := own.Verify(x509.VerifyOptions{Roots: roots, DNSName: svcName, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
		return fmt.Errorf("control: tenant B's own certificate is not trusted by its bundle: %v", err)
	}

	a := nstancev1.NewOperatorServiceClient(e.connA)
	resp, err := a.CreateInstance(ctx, &nstancev1.CreateInstanceRequest{Template: "svc", ClientToken: "a-steals-b-name",
		Vars: map[string]string{"san_dns": svcName}})
	if err != nil {
		return fmt.Errorf("tenant A creating its instance: %w", err)
	}
	id := resp.GetInstance().GetInstanceId()
	defer func() {
		_, _ = a.DeleteInstance(context.WithoutCancel(ctx), &nstancev1.DeleteInstanceRequest{InstanceId: id, SkipDrain: true})
	}()
	var certPEM []byte
	if err := proctest.Wait(ctx, "tenant A's instance "+id+" holding files/svc.crt", 45*time.Second, func() bool {
		certPEM, err = e.instanceFile(id, "files/svc.crt")
		return err == nil && len(certPEM) > 0
	}); err != nil {
		return err
	}
	stolen, err := parsePEMCert(certPEM)
	if err != nil {
		return fmt.Errorf("tenant A's certificate: %w", err)
	}
	if !containsName(stolen.DNSNames, svcName) {
		return fmt.Errorf("tenant A's certificate names %v, not %s: the attack did not get its name", stolen.DNSNames, svcName)
	}
	if _, err := stolen.Verify(x509.VerifyOptions{Roots: roots, DNSName: svcName, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err == nil {
		return fmt.Errorf("tenant A's certificate for %s (issuer %q) is trusted by tenant B's instance's CA bundle", svcName, stolen.Issuer.CommonName)
	}
	return nil
}

func containsName(names []string, want string) bool {
	for _, n := range names {
		if strings.EqualFold(n, want) {
			return true
		}
	}
	return false
}

// svcTenants is the tenants line of template "svc" (and the declaration)
// in the stack's config.
var svcTenants = fmt.Sprintf(`"tenants": [%q, %q],`, tenantA, tenantB)

// tenantedConfig adds template "svc-b" for tenant B only.
func tenantedConfig(good string) string {
	return strings.Replace(good, `"templates": {`, `"templates": {
    "svc-b": { "kind": "worker", "arch": "amd64", "instance_type": "dev.small", "subnet_pool": "default", "tenants": [`+fmt.Sprintf("%q", tenantB)+`] },`, 1)
}

// withConfig uploads mutate(config of dev-1), has the admin refresh it
// (it must apply), runs fn, and restores the config.
func withConfig(ctx context.Context, e *env, mutate func(string) string, fn func() error) (err error) {
	key := e.s.keys.Config(e.dev1.shard)
	good, err := e.s.get(ctx, key)
	if err != nil {
		return err
	}
	changed := mutate(string(good))
	if changed == string(good) {
		return errors.New("could not derive the config")
	}
	admin, err := e.l.dial(e.dev1.operator, &e.adminA)
	if err != nil {
		return err
	}
	defer admin.Close()
	c := nstancev1.NewOperatorServiceClient(admin)
	if _, err := e.s.store.Put(ctx, key, []byte(changed), putOpts()); err != nil {
		return err
	}
	defer func() {
		rctx := context.WithoutCancel(ctx)
		if _, perr := e.s.store.Put(rctx, key, good, putOpts()); perr != nil {
			err = errors.Join(err, fmt.Errorf("restoring the config: %w", perr))
			return
		}
		if r, rerr := c.RefreshConfig(rctx, &nstancev1.RefreshConfigRequest{}); rerr != nil || r.Outcome == nstancev1.RefreshConfigOutcome_REFRESH_CONFIG_OUTCOME_INVALID {
			err = errors.Join(err, fmt.Errorf("restoring the config: %v %v", r, rerr))
		}
	}()
	resp, err := c.RefreshConfig(ctx, &nstancev1.RefreshConfigRequest{})
	if err != nil {
		return fmt.Errorf("RefreshConfig: %w", err)
	}
	if resp.Outcome != nstancev1.RefreshConfigOutcome_REFRESH_CONFIG_OUTCOME_UPDATED {
		all := resp.Message
		for _, v := range resp.ValidationErrors {
			all += " " + v.String()
		}
		return fmt.Errorf("the config with template tenants was not applied (%v): %s", resp.Outcome, all)
	}
	return fn()
}

// deniedTemplate checks a refusal: PermissionDenied naming the template
// and the tenant, and not tenant B.
func deniedTemplate(what string, err error, template string) error {
	if status.Code(err) != codes.PermissionDenied {
		return fmt.Errorf("%s: want PermissionDenied, got %v", what, err)
	}
	msg := status.Convert(err).Message()
	if !strings.Contains(msg, `"`+template+`"`) || !strings.Contains(msg, `"`+tenantA+`"`) {
		return fmt.Errorf("%s: the refusal does not name template %q and tenant %q: %s", what, template, tenantA, msg)
	}
	if strings.Contains(msg, tenantB) {
		return fmt.Errorf("%s: the refusal names tenant B: %s", what, msg)
	}
	return nil
}

// restrictedTemplate: with template "svc-b" listing only tenant B, tenant A
// can neither create a group from it, move its own group to it, nor create
// an instance from it; tenant B can (control).
func restrictedTemplate(ctx context.Context, e *env) error {
	return withConfig(ctx, e, tenantedConfig, func() error {
		a := nstancev1.NewOperatorServiceClient(e.connA)
		b := nstancev1.NewOperatorServiceClient(e.connB)
		_, err := a.UpsertGroup(ctx, &nstancev1.UpsertGroupRequest{Group: &nstancev1.GroupSpec{GroupId: "steal", Template: "svc-b", Size: 1}})
		if err == nil {
			_, _ = a.DeleteGroup(context.WithoutCancel(ctx), &nstancev1.DeleteGroupRequest{GroupId: "steal"})
		}
		if err := deniedTemplate("UpsertGroup", err, "svc-b"); err != nil {
			return err
		}
		if _, err := a.UpsertGroup(ctx, &nstancev1.UpsertGroupRequest{Group: &nstancev1.GroupSpec{GroupId: "amove", Template: "svc", Size: 0}}); err != nil {
			return fmt.Errorf("tenant A creating its own group from svc: %w", err)
		}
		defer func() {
			_, _ = a.DeleteGroup(context.WithoutCancel(ctx), &nstancev1.DeleteGroupRequest{GroupId: "amove"})
		}()
		_, err = a.UpsertGroup(ctx, &nstancev1.UpsertGroupRequest{Group: &nstancev1.GroupSpec{GroupId: "amove", Template: "svc-b", Size: 0}})
		if err := deniedTemplate("UpsertGroup moving a group to svc-b", err, "svc-b"); err != nil {
			return err
		}
		groups, err := a.ListGroups(ctx, &nstancev1.ListGroupsRequest{})
		if err != nil {
			return err
		}
		for _, g := range groups.Groups {
			if g.GetSpec().GetTemplate() == "svc-b" {
				return fmt.Errorf("tenant A holds group %s of template svc-b", g.GetSpec().GetGroupId())
			}
		}
		resp, err := a.CreateInstance(ctx, &nstancev1.CreateInstanceRequest{Template: "svc-b"})
		if resp.GetInstance() != nil {
			_, _ = a.DeleteInstance(context.WithoutCancel(ctx), &nstancev1.DeleteInstanceRequest{InstanceId: resp.Instance.InstanceId, SkipDrain: true})
		}
		if err := deniedTemplate("CreateInstance", err, "svc-b"); err != nil {
			return err
		}
		if _, err := b.UpsertGroup(ctx, &nstancev1.UpsertGroupRequest{Group: &nstancev1.GroupSpec{GroupId: "bown", Template: "svc-b", Size: 0}}); err != nil {
			return fmt.Errorf("control: tenant B creating a group from its template svc-b: %w", err)
		}
		_, _ = b.DeleteGroup(context.WithoutCancel(ctx), &nstancev1.DeleteGroupRequest{GroupId: "bown"})
		return nil
	})
}

// templateWithoutTenants: the stack's config declares two tenants; without
// its tenants list template "svc" would be open to both: that config is
// refused naming templates.svc.tenants, and the shard keeps its config.
func templateWithoutTenants(ctx context.Context, e *env) error {
	return refusedConfig(ctx, e, func(good string) string {
		// svc's line (indented under the template), not the declaration.
		return strings.Replace(good, "\n      "+svcTenants, "", 1)
	}, "templates.svc.tenants", "required")
}
