package tenantops

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/nstance-dev/nstance/internal/config"
	"github.com/nstance-dev/nstance/internal/server/groups"
	"github.com/nstance-dev/nstance/internal/server/instances"
	"github.com/nstance-dev/nstance/internal/server/loadbalancer"
	"github.com/nstance-dev/nstance/internal/server/reconcile/planner"
	"github.com/nstance-dev/nstance/internal/server/userdata"
	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

// Errors returned by the operations below, for the API layer to map.
var (
	ErrNotFound     = errors.New("not found")
	ErrInvalid      = errors.New("invalid request")
	ErrConflict     = errors.New("conflict")
	ErrNotPermitted = errors.New("not permitted")
	// ErrQuota: a tenant quota or rate (shard.limits) refused the request.
	ErrQuota = errors.New("quota exceeded")
	// ErrDenied: the tenant may not use what it names (a template whose
	// tenants list does not name it).
	ErrDenied = errors.New("permission denied")
)

// checkTemplateTenant refuses a template the tenant may not use.
func checkTemplateTenant(cfg *config.Config, template, tenant string) error {
	if reason := cfg.CheckTemplateTenant(template, tenant); reason != "" {
		return fmt.Errorf("%w: template: %s", ErrDenied, reason)
	}
	return nil
}

// InvalidError carries the field errors of a rejected request.
type InvalidError struct{ Fields []config.FieldError }

func (e *InvalidError) Error() string { return config.Errors(e.Fields).Error() }

// Unwrap makes errors.Is(err, ErrInvalid) true.
func (e *InvalidError) Unwrap() error { return ErrInvalid }

func invalid(fields ...config.FieldError) error { return &InvalidError{Fields: fields} }

// SpecFromProto converts a wire spec, checking the duration.
func SpecFromProto(p *nstancev1.GroupSpec) (groups.Spec, error) {
	s := groups.Spec{Template: p.GetTemplate(), Size: int(p.GetSize()), InstanceType: p.GetInstanceType(),
		SubnetPool: p.GetSubnetPool(), Vars: maps.Clone(p.GetVars()), Labels: maps.Clone(p.GetLabels()), Image: p.GetImage()}
	if p.GetDrainTimeout() != nil {
		if err := p.GetDrainTimeout().CheckValid(); err != nil {
			return s, invalid(config.FieldError{Key: "drain_timeout", Reason: err.Error()})
		}
		s.DrainTimeout = p.GetDrainTimeout().AsDuration()
		if s.DrainTimeout < 0 {
			return s, invalid(config.FieldError{Key: "drain_timeout", Reason: "must not be negative"})
		}
	}
	if r := p.GetRollout(); r != nil {
		s.Rollout = groups.Rollout{MaxUnavailable: int(r.GetMaxUnavailable()), Paused: r.GetPaused()}
		if r.MaxSurge != nil {
			v := int(r.GetMaxSurge())
			s.Rollout.MaxSurge = &v
		}
	}
	return s, nil
}

// ListGroups returns the wire status of every group of tenant, sorted by id.
func (o *Ops) ListGroups(tenant string) []*nstancev1.GroupStatus {
	gs := o.o.Groups.List(tenant)
	out := make([]*nstancev1.GroupStatus, 0, len(gs))
	for _, g := range gs {
		out = append(out, o.o.Reconciler.GroupStatus(g))
	}
	return out
}

func mapGroupErr(err error) error {
	switch {
	case errors.Is(err, groups.ErrStatic):
		return fmt.Errorf("%w: %v", ErrNotPermitted, err)
	case errors.Is(err, groups.ErrETag):
		return fmt.Errorf("%w: %v", ErrConflict, err)
	case errors.Is(err, groups.ErrNotFound):
		return fmt.Errorf("%w: %v", ErrNotFound, err)
	case errors.Is(err, groups.ErrQuota):
		return fmt.Errorf("%w: %v", ErrQuota, err)
	}
	return err
}

// UpsertGroup validates and stores a dynamic group, then reconciles it.
func (o *Ops) UpsertGroup(ctx context.Context, tenant string, p *nstancev1.GroupSpec, expectedETag string) (*nstancev1.GroupStatus, bool, error) {
	// Nothing is decided on state not yet checked against storage.
	if err := o.o.Reconciler.AwaitVerified(ctx); err != nil {
		return nil, false, err
	}
	if p == nil {
		return nil, false, invalid(config.FieldError{Key: "group", Reason: "required"})
	}
	spec, err := SpecFromProto(p)
	if err != nil {
		return nil, false, err
	}
	// A template of other tenants is refused before anything else is
	// checked against it (a new group, or an existing group moved to it).
	if err := checkTemplateTenant(o.o.Config(), spec.Template, tenant); err != nil {
		return nil, false, err
	}
	if fes := groups.Validate(o.o.Config(), tenant, p.GetGroupId(), spec); len(fes) > 0 {
		return nil, false, invalid(fes...)
	}
	k := groups.Key{Tenant: tenant, ID: p.GetGroupId()}
	var held string
	if g, ok := o.o.Groups.Get(k); ok {
		held = g.Spec.UserDataSHA256
	}
	if spec.UserDataSHA256, spec.UserDataFormat, err = o.userData(ctx, tenant, "group "+k.ID, p.GetUserData(),
		p.GetUserDataFormat(), p.GetUserDataSha256(), held); err != nil {
		return nil, false, err
	}
	lim := o.o.Config().Shard.Limits.WithDefaults()
	g, created, err := o.o.Groups.UpsertWithin(ctx, k, spec, expectedETag, groups.Quota{Groups: lim.MaxGroupsPerTenant, Bytes: lim.MaxTenantGroupBytes})
	if err != nil {
		return nil, false, mapGroupErr(err)
	}
	o.o.Reconciler.GroupChanged(k)
	return o.o.Reconciler.GroupStatus(g), created, nil
}

// DeleteGroup removes a dynamic group; its instances are drained and deleted.
func (o *Ops) DeleteGroup(ctx context.Context, tenant, id, expectedETag string) (int, error) {
	// Nothing is decided on state not yet checked against storage.
	if err := o.o.Reconciler.AwaitVerified(ctx); err != nil {
		return 0, err
	}
	if id == "" {
		return 0, invalid(config.FieldError{Key: "group_id", Reason: "required"})
	}
	k := groups.Key{Tenant: tenant, ID: id}
	if _, err := o.o.Groups.Delete(ctx, k, expectedETag); err != nil {
		return 0, mapGroupErr(err)
	}
	n := 0
	for _, rec := range o.o.Instances.ListGroup(tenant, id) {
		if !rec.OnDemand && rec.State.Active() {
			n++
		}
	}
	o.o.Reconciler.GroupChanged(k)
	return n, nil
}

// CreateInstanceRequest is an on-demand instance request.
type CreateInstanceRequest struct {
	GroupID, Template, InstanceType, SubnetPool, ClientToken string
	Vars, Labels                                             map[string]string
	DrainTimeout                                             time.Duration
	// Image replaces the group's (and the template's) image.
	Image string
	// UserData is the instance's own bootstrap data (replaces its group's).
	UserData       []byte
	UserDataFormat string
}

// userData stores bootstrap data a tenant sent for what (a group, an
// instance) and returns its hash and format. With no data, keep names the
// data to keep: it must be what the group holds (held); empty keep means
// none (the template's userdata).
func (o *Ops) userData(ctx context.Context, tenant, what string, data []byte, format, keep, held string) (string, string, error) {
	if len(data) == 0 {
		if keep == "" {
			return "", "", nil
		}
		if keep != held {
			return "", "", invalid(config.FieldError{Key: "user_data_sha256", Reason: fmt.Sprintf(
				"%s holds no user data with this hash; send the data itself in user_data", what)})
		}
		f, err := userdata.CheckFormat(format)
		if err != nil {
			return "", "", invalid(config.FieldError{Key: "user_data_format", Reason: err.Error()})
		}
		return keep, f, nil
	}
	f, err := userdata.CheckFormat(format)
	if err != nil {
		return "", "", invalid(config.FieldError{Key: "user_data_format", Reason: err.Error()})
	}
	if err := userdata.CheckSize(what, data, o.o.Config().Shard.Limits.WithDefaults().MaxUserDataBytes); err != nil {
		return "", "", invalid(config.FieldError{Key: "user_data", Reason: err.Error()})
	}
	if sum := userdata.Sum(data); keep != "" && keep != sum {
		return "", "", invalid(config.FieldError{Key: "user_data_sha256", Reason: "does not match the SHA-256 of user_data"})
	}
	if o.o.UserData == nil {
		return "", "", fmt.Errorf("%w: this server stores no user data", ErrNotPermitted)
	}
	sum, err := o.o.UserData.Put(ctx, tenant, data)
	if err != nil {
		return "", "", err
	}
	return sum, f, nil
}

// CreateInstance records an on-demand instance and schedules its creation.
// A repeated client token returns the instance created the first time.
func (o *Ops) CreateInstance(ctx context.Context, tenant string, req CreateInstanceRequest) (*instances.Record, error) {
	// Nothing is decided on state not yet checked against storage.
	if err := o.o.Reconciler.AwaitVerified(ctx); err != nil {
		return nil, err
	}
	o.tokenMu.Lock()
	defer o.tokenMu.Unlock()
	if req.ClientToken != "" {
		if len(req.ClientToken) > 128 {
			return nil, invalid(config.FieldError{Key: "client_token", Reason: "must be at most 128 characters"})
		}
		if rec, ok := o.o.Instances.ByClientToken(tenant, req.ClientToken); ok {
			return rec, nil
		}
	}
	var spec *groups.Spec
	if req.GroupID != "" {
		g, ok := o.o.Groups.Get(groups.Key{Tenant: tenant, ID: req.GroupID})
		if !ok {
			return nil, fmt.Errorf("%w: group %q", ErrNotFound, req.GroupID)
		}
		spec = &g.Spec
	}
	if req.DrainTimeout < 0 {
		return nil, invalid(config.FieldError{Key: "drain_timeout", Reason: "must not be negative"})
	}
	if fe := groups.CheckImage(req.Image); fe != nil {
		return nil, invalid(*fe)
	}
	labels, vars := map[string]string{}, map[string]string{}
	if spec != nil {
		maps.Copy(labels, spec.Labels)
		maps.Copy(vars, spec.Vars)
	}
	maps.Copy(labels, req.Labels)
	maps.Copy(vars, req.Vars)
	// The tenant's vars and labels are counted and measured (the config's
	// own are not) before anything renders them or any user data is stored.
	if fes := groups.CheckMaps(o.o.Config(), vars, labels); len(fes) > 0 {
		return nil, invalid(fes...)
	}
	var udSum, udFormat string
	if len(req.UserData) > 0 {
		what := "on-demand instance"
		if req.GroupID != "" {
			what += " of group " + req.GroupID
		}
		var err error
		if udSum, udFormat, err = o.userData(ctx, tenant, what, req.UserData, req.UserDataFormat, "", ""); err != nil {
			return nil, err
		}
	}
	eff, err := groups.Resolve(o.o.Config(), spec, groups.Overrides{Template: req.Template, InstanceType: req.InstanceType,
		SubnetPool: req.SubnetPool, Vars: req.Vars, DrainTimeout: req.DrainTimeout, Image: req.Image, UserDataSHA256: udSum, UserDataFormat: udFormat})
	if err != nil {
		return nil, invalid(config.FieldError{Reason: err.Error()})
	}
	if err := checkTemplateTenant(o.o.Config(), eff.Template, tenant); err != nil {
		return nil, err
	}
	if fes := groups.CheckCertificateNames(o.o.Config(), tenant, req.GroupID, eff); len(fes) > 0 {
		return nil, invalid(fes...)
	}
	if fes := groups.CheckTenantVars(o.o.Config(), tenant, req.GroupID, eff, vars); len(fes) > 0 {
		return nil, invalid(fes...)
	}
	// The tenant's create rate is charged last, so a refused request costs nothing.
	if !o.o.Reconciler.AdmitCreate(tenant) {
		rl := o.o.Config().Shard.Limits.WithDefaults().TenantCreateRate
		return nil, fmt.Errorf("%w: tenant %s creates instances faster than shard.limits.tenant_create_rate (%d a minute, bursts of %d); retry later",
			ErrQuota, tenant, rl.PerMinute, rl.Burst)
	}
	rec, err := o.o.Reconciler.NewRecord(tenant, req.GroupID, eff, labels)
	if err != nil {
		return nil, err
	}
	rec.OnDemand, rec.ClientToken = true, req.ClientToken
	rec.Requested = &instances.Requested{Template: req.Template, InstanceType: req.InstanceType, SubnetPool: req.SubnetPool,
		Image: req.Image, Vars: maps.Clone(req.Vars), UserDataSHA256: udSum, UserDataFormat: udFormat}
	if err := o.o.Instances.Create(ctx, rec); err != nil {
		return nil, err
	}
	o.o.Reconciler.EnqueueInstance(rec.ID)
	return rec, nil
}

func (o *Ops) tenantRecord(tenant, id string) (*instances.Record, error) {
	if id == "" {
		return nil, invalid(config.FieldError{Key: "instance_id", Reason: "required"})
	}
	rec, ok := o.o.Instances.Get(id)
	if !ok || rec.Tenant != tenant {
		// Another tenant's instance is indistinguishable from a missing one.
		return nil, fmt.Errorf("%w: instance %q", ErrNotFound, id)
	}
	return rec, nil
}

// GetInstance returns a tenant's instance by id or client token.
func (o *Ops) GetInstance(tenant, id, clientToken string) (*instances.Record, error) {
	if clientToken != "" {
		rec, ok := o.o.Instances.ByClientToken(tenant, clientToken)
		if !ok {
			return nil, fmt.Errorf("%w: no instance with client token %q", ErrNotFound, clientToken)
		}
		return rec, nil
	}
	return o.tenantRecord(tenant, id)
}

// ListInstances returns a tenant's instances, sorted by id. Empty filters
// match everything; otherwise an instance must belong to one of groupIDs and
// be in one of states.
func (o *Ops) ListInstances(tenant string, groupIDs []string, states []nstancev1.InstanceState) []*nstancev1.InstanceStatus {
	recs := o.o.Instances.List(func(x *instances.Record) bool {
		return x.Tenant == tenant &&
			(len(groupIDs) == 0 || slices.Contains(groupIDs, x.GroupID)) &&
			(len(states) == 0 || slices.Contains(states, x.State.Proto()))
	})
	out := make([]*nstancev1.InstanceStatus, 0, len(recs))
	for _, rec := range recs {
		out = append(out, o.Status(rec))
	}
	return out
}

// Status is rec's wire form with the agent version of the latest report,
// so an instance counted ready never shows no version while the record's
// write is still queued.
func (o *Ops) Status(rec *instances.Record) *nstancev1.InstanceStatus {
	st := rec.Proto()
	if v := o.o.Reconciler.ReportedVersion(rec.ID); v != "" {
		st.AgentVersion = v
	}
	st.Drifted = o.drifted(rec)
	// Load balancers its group wants and it is not at yet are pending;
	// each shows the term's last failed call.
	if rec.State.Active() {
		for _, name := range o.o.Reconciler.WantLoadBalancers(rec) {
			if _, ok := rec.LoadBalancers[name]; !ok {
				st.LoadBalancers = append(st.LoadBalancers, instances.LoadBalancerProto(name, loadbalancer.TargetState{}))
			}
		}
		slices.SortFunc(st.LoadBalancers, func(a, b *nstancev1.LoadBalancerTarget) int { return strings.Compare(a.GetName(), b.GetName()) })
	}
	for _, t := range st.LoadBalancers {
		t.LastError = o.o.Reconciler.LBError(rec.ID, t.GetName())
	}
	return st
}

// drifted reports whether rec was created with other infra settings than
// it would get now (planner.Drifted): a group member against its group's
// current settings, as the rotation sees it; an on-demand instance against
// its own request resolved again with the current config and group. False
// when that cannot be told: not active, group or template gone, an
// on-demand record from before requests were recorded.
func (o *Ops) drifted(rec *instances.Record) bool {
	if !rec.State.Active() || (rec.OnDemand && rec.Requested == nil) {
		return false
	}
	var spec *groups.Spec
	if rec.GroupID != "" {
		g, ok := o.o.Groups.Get(groups.Key{Tenant: rec.Tenant, ID: rec.GroupID})
		if !ok {
			return false
		}
		spec = &g.Spec
	}
	var ov groups.Overrides
	if q := rec.Requested; rec.OnDemand {
		ov = groups.Overrides{Template: q.Template, InstanceType: q.InstanceType, SubnetPool: q.SubnetPool, Image: q.Image, Vars: q.Vars,
			UserDataSHA256: q.UserDataSHA256, UserDataFormat: q.UserDataFormat}
	}
	eff, err := groups.Resolve(o.o.Config(), spec, ov)
	if err != nil {
		return false
	}
	return planner.Drifted(rec, eff)
}

// MarkForScaleDown keeps a group member running and makes it the first one
// the group's next scale-down removes (with skipDrain), so that lowering the
// group's size by one removes exactly this instance and nothing replaces it.
// Deleting it at once instead would make the group create a replacement
// before the size comes down; lowering the size first would let the
// scale-down pick any member. The mark is idempotent; an instance already
// being deleted is returned as it is.
func (o *Ops) MarkForScaleDown(ctx context.Context, tenant, id string, skipDrain bool) (*instances.Record, error) {
	// Nothing is decided on state not yet checked against storage.
	if err := o.o.Reconciler.AwaitVerified(ctx); err != nil {
		return nil, err
	}
	rec, err := o.tenantRecord(tenant, id)
	if err != nil {
		return nil, err
	}
	if rec.GroupID == "" || rec.OnDemand {
		return nil, invalid(config.FieldError{Key: "on_scale_down", Reason: "instance " + id + " is not a member of a group"})
	}
	if !rec.State.Active() || (rec.ScaleDownFirst && rec.ScaleDownSkipDrain == skipDrain) {
		return rec, nil
	}
	rec, err = o.o.Instances.Update(ctx, id, func(x *instances.Record) error {
		if !x.State.Active() {
			return instances.ErrNoChange
		}
		x.ScaleDownFirst, x.ScaleDownSkipDrain = true, skipDrain
		x.UpdatedAt = o.o.Now().UTC()
		return nil
	})
	if errors.Is(err, instances.ErrNotFound) {
		return nil, fmt.Errorf("%w: instance %q", ErrNotFound, id)
	}
	if err != nil {
		return nil, err
	}
	o.o.Reconciler.EnqueueGroup(groups.Key{Tenant: rec.Tenant, ID: rec.GroupID})
	return rec, nil
}

// DeleteInstance starts the deletion of a tenant's instance.
func (o *Ops) DeleteInstance(ctx context.Context, tenant, id string, skipDrain bool) (*instances.Record, error) {
	// Nothing is decided on state not yet checked against storage.
	if err := o.o.Reconciler.AwaitVerified(ctx); err != nil {
		return nil, err
	}
	before, err := o.tenantRecord(tenant, id)
	if err != nil {
		return nil, err
	}
	if err := o.o.Reconciler.BeginDeletion(ctx, id, nstancev1.DeletionReason_DELETION_REASON_ON_DEMAND_DELETE, skipDrain, "deletion requested through the API"); err != nil {
		return nil, err
	}
	if rec, ok := o.o.Instances.Get(id); ok {
		return rec, nil
	}
	// Already gone (skip_drain on a fast provider): report it deleted.
	before.State = instances.StateDeleted
	return before, nil
}

// AcknowledgeDrained lets a pending-deletion instance be deleted now.
func (o *Ops) AcknowledgeDrained(ctx context.Context, tenant, id string) (*instances.Record, error) {
	// Nothing is decided on state not yet checked against storage.
	if err := o.o.Reconciler.AwaitVerified(ctx); err != nil {
		return nil, err
	}
	rec, err := o.tenantRecord(tenant, id)
	if err != nil {
		return nil, err
	}
	switch rec.State {
	case instances.StateDeleting:
		return rec, nil
	case instances.StatePendingDeletion:
	default:
		return nil, fmt.Errorf("%w: instance %q is %s, not pending deletion", ErrConflict, id, rec.State)
	}
	rec, err = o.o.Instances.Update(ctx, id, func(x *instances.Record) error {
		if x.State != instances.StatePendingDeletion || x.DrainAcked {
			return instances.ErrNoChange
		}
		x.DrainAcked, x.UpdatedAt = true, o.o.Now().UTC()
		return nil
	})
	if err != nil {
		return nil, err
	}
	o.o.Reconciler.EnqueueInstance(id)
	return rec, nil
}

// PendingDrains returns a PENDING_DELETION event for every instance of the
// tenant that still waits for a drain acknowledgement, sorted by id. A
// watcher that connects (or reconnects) receives them first, so a drain
// announced while no operator listened is never lost.
func (o *Ops) PendingDrains(tenant string) []*nstancev1.InstanceEvent {
	recs := o.o.Instances.List(func(x *instances.Record) bool {
		return x.Tenant == tenant && x.State == instances.StatePendingDeletion && !x.DrainAcked
	})
	out := make([]*nstancev1.InstanceEvent, 0, len(recs))
	for _, rec := range recs {
		ev := &nstancev1.InstanceEvent{
			Status: nstancev1.InstanceEventStatus_INSTANCE_EVENT_STATUS_PENDING_DELETION, Reason: rec.DeletionReason,
			InstanceId: rec.ID, ProviderId: rec.ProviderID, GroupId: rec.GroupID,
			OccurredAt: timestamppb.New(rec.UpdatedAt), Shard: o.o.Shard, Message: rec.Message, Replaced: rec.Replaced(),
		}
		if rec.DrainDeadline != nil {
			ev.DrainDeadline = timestamppb.New(*rec.DrainDeadline)
		}
		out = append(out, ev)
	}
	return out
}
