package reconcile

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/nstance-dev/nstance/internal/server/config"
	"github.com/nstance-dev/nstance/internal/server/groups"
	"github.com/nstance-dev/nstance/internal/server/instances"
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
)

// InvalidError carries the field errors of a rejected request.
type InvalidError struct{ Fields []config.FieldError }

func (e *InvalidError) Error() string { return config.Errors(e.Fields).Error() }

// Unwrap makes errors.Is(err, ErrInvalid) true.
func (e *InvalidError) Unwrap() error { return ErrInvalid }

func invalid(fields ...config.FieldError) error { return &InvalidError{Fields: fields} }

// SpecProto converts a group's spec to its wire form.
func SpecProto(g *groups.Group) *nstancev1.GroupSpec {
	s := &nstancev1.GroupSpec{
		GroupId: g.ID, Template: g.Spec.Template, Size: uint32(g.Spec.Size), InstanceType: g.Spec.InstanceType,
		SubnetPool: g.Spec.SubnetPool, Vars: maps.Clone(g.Spec.Vars), Labels: maps.Clone(g.Spec.Labels),
	}
	if g.Spec.DrainTimeout > 0 {
		s.DrainTimeout = durationpb.New(g.Spec.DrainTimeout)
	}
	return s
}

// SpecFromProto converts a wire spec, checking the duration.
func SpecFromProto(p *nstancev1.GroupSpec) (groups.Spec, error) {
	s := groups.Spec{Template: p.GetTemplate(), Size: int(p.GetSize()), InstanceType: p.GetInstanceType(),
		SubnetPool: p.GetSubnetPool(), Vars: maps.Clone(p.GetVars()), Labels: maps.Clone(p.GetLabels())}
	if p.GetDrainTimeout() != nil {
		if err := p.GetDrainTimeout().CheckValid(); err != nil {
			return s, invalid(config.FieldError{Key: "drain_timeout", Reason: err.Error()})
		}
		s.DrainTimeout = p.GetDrainTimeout().AsDuration()
		if s.DrainTimeout < 0 {
			return s, invalid(config.FieldError{Key: "drain_timeout", Reason: "must not be negative"})
		}
	}
	return s, nil
}

// ListGroups returns the wire status of every group of tenant, sorted by id.
func (r *Reconciler) ListGroups(tenant string) []*nstancev1.GroupStatus {
	gs := r.o.Groups.List(tenant)
	out := make([]*nstancev1.GroupStatus, 0, len(gs))
	for _, g := range gs {
		out = append(out, r.GroupStatus(g))
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
func (r *Reconciler) UpsertGroup(ctx context.Context, tenant string, p *nstancev1.GroupSpec, expectedETag string) (*nstancev1.GroupStatus, bool, error) {
	// Nothing is decided on state not yet checked against storage.
	if err := r.awaitVerified(ctx); err != nil {
		return nil, false, err
	}
	if p == nil {
		return nil, false, invalid(config.FieldError{Key: "group", Reason: "required"})
	}
	spec, err := SpecFromProto(p)
	if err != nil {
		return nil, false, err
	}
	if fes := groups.Validate(r.cfg(), tenant, p.GetGroupId(), spec); len(fes) > 0 {
		return nil, false, invalid(fes...)
	}
	k := groups.Key{Tenant: tenant, ID: p.GetGroupId()}
	g, created, err := r.o.Groups.UpsertWithin(ctx, k, spec, expectedETag, r.cfg().Shard.Limits.WithDefaults().MaxGroupsPerTenant)
	if err != nil {
		return nil, false, mapGroupErr(err)
	}
	r.GroupChanged(k)
	return r.GroupStatus(g), created, nil
}

// DeleteGroup removes a dynamic group; its instances are drained and deleted.
func (r *Reconciler) DeleteGroup(ctx context.Context, tenant, id, expectedETag string) (int, error) {
	// Nothing is decided on state not yet checked against storage.
	if err := r.awaitVerified(ctx); err != nil {
		return 0, err
	}
	if id == "" {
		return 0, invalid(config.FieldError{Key: "group_id", Reason: "required"})
	}
	k := groups.Key{Tenant: tenant, ID: id}
	if _, err := r.o.Groups.Delete(ctx, k, expectedETag); err != nil {
		return 0, mapGroupErr(err)
	}
	n := 0
	for _, rec := range r.o.Instances.ListGroup(tenant, id) {
		if !rec.OnDemand && rec.State.Active() {
			n++
		}
	}
	r.GroupChanged(k)
	return n, nil
}

// CreateInstanceRequest is an on-demand instance request.
type CreateInstanceRequest struct {
	GroupID, Template, InstanceType, SubnetPool, ClientToken string
	Vars, Labels                                             map[string]string
	DrainTimeout                                             time.Duration
}

// CreateInstance records an on-demand instance and schedules its creation.
// A repeated client token returns the instance created the first time.
func (r *Reconciler) CreateInstance(ctx context.Context, tenant string, req CreateInstanceRequest) (*instances.Record, error) {
	// Nothing is decided on state not yet checked against storage.
	if err := r.awaitVerified(ctx); err != nil {
		return nil, err
	}
	r.createMu.Lock()
	defer r.createMu.Unlock()
	if req.ClientToken != "" {
		if len(req.ClientToken) > 128 {
			return nil, invalid(config.FieldError{Key: "client_token", Reason: "must be at most 128 characters"})
		}
		if rec, ok := r.o.Instances.ByClientToken(tenant, req.ClientToken); ok {
			return rec, nil
		}
	}
	var spec *groups.Spec
	if req.GroupID != "" {
		g, ok := r.o.Groups.Get(groups.Key{Tenant: tenant, ID: req.GroupID})
		if !ok {
			return nil, fmt.Errorf("%w: group %q", ErrNotFound, req.GroupID)
		}
		spec = &g.Spec
	}
	if req.DrainTimeout < 0 {
		return nil, invalid(config.FieldError{Key: "drain_timeout", Reason: "must not be negative"})
	}
	eff, err := groups.Resolve(r.cfg(), spec, groups.Overrides{Template: req.Template, InstanceType: req.InstanceType,
		SubnetPool: req.SubnetPool, Vars: req.Vars, DrainTimeout: req.DrainTimeout})
	if err != nil {
		return nil, invalid(config.FieldError{Reason: err.Error()})
	}
	if fes := groups.CheckCertificateNames(r.cfg(), tenant, req.GroupID, eff); len(fes) > 0 {
		return nil, invalid(fes...)
	}
	labels, vars := map[string]string{}, map[string]string{}
	if spec != nil {
		maps.Copy(labels, spec.Labels)
		maps.Copy(vars, spec.Vars)
	}
	maps.Copy(labels, req.Labels)
	maps.Copy(vars, req.Vars)
	// The tenant's vars and labels are counted; the config's own are not.
	if fes := groups.CheckCounts(r.cfg(), vars, labels); len(fes) > 0 {
		return nil, invalid(fes...)
	}
	// The tenant's create rate is charged last, so a refused request costs nothing.
	if !r.admitCreate(tenant) {
		rl := r.cfg().Shard.Limits.WithDefaults().TenantCreateRate
		return nil, fmt.Errorf("%w: tenant %s creates instances faster than shard.limits.tenant_create_rate (%d a minute, bursts of %d); retry later",
			ErrQuota, tenant, rl.PerMinute, rl.Burst)
	}
	rec, err := r.newRecord(tenant, req.GroupID, eff, labels)
	if err != nil {
		return nil, err
	}
	rec.OnDemand, rec.ClientToken = true, req.ClientToken
	if err := r.o.Instances.Create(ctx, rec); err != nil {
		return nil, err
	}
	r.EnqueueInstance(rec.ID)
	return rec, nil
}

func (r *Reconciler) tenantRecord(tenant, id string) (*instances.Record, error) {
	if id == "" {
		return nil, invalid(config.FieldError{Key: "instance_id", Reason: "required"})
	}
	rec, ok := r.o.Instances.Get(id)
	if !ok || rec.Tenant != tenant {
		// Another tenant's instance is indistinguishable from a missing one.
		return nil, fmt.Errorf("%w: instance %q", ErrNotFound, id)
	}
	return rec, nil
}

// GetInstance returns a tenant's instance by id or client token.
func (r *Reconciler) GetInstance(tenant, id, clientToken string) (*instances.Record, error) {
	if clientToken != "" {
		rec, ok := r.o.Instances.ByClientToken(tenant, clientToken)
		if !ok {
			return nil, fmt.Errorf("%w: no instance with client token %q", ErrNotFound, clientToken)
		}
		return rec, nil
	}
	return r.tenantRecord(tenant, id)
}

// ListInstances returns a tenant's instances, sorted by id. Empty filters
// match everything; otherwise an instance must belong to one of groupIDs and
// be in one of states.
func (r *Reconciler) ListInstances(tenant string, groupIDs []string, states []nstancev1.InstanceState) []*nstancev1.InstanceStatus {
	recs := r.o.Instances.List(func(x *instances.Record) bool {
		return x.Tenant == tenant &&
			(len(groupIDs) == 0 || slices.Contains(groupIDs, x.GroupID)) &&
			(len(states) == 0 || slices.Contains(states, x.State.Proto()))
	})
	out := make([]*nstancev1.InstanceStatus, 0, len(recs))
	for _, rec := range recs {
		out = append(out, rec.Proto())
	}
	return out
}

// MarkForScaleDown keeps a group member running and makes it the first one
// the group's next scale-down removes (with skipDrain), so that lowering the
// group's size by one removes exactly this instance and nothing replaces it.
// Deleting it at once instead would make the group create a replacement
// before the size comes down; lowering the size first would let the
// scale-down pick any member. The mark is idempotent; an instance already
// being deleted is returned as it is.
func (r *Reconciler) MarkForScaleDown(ctx context.Context, tenant, id string, skipDrain bool) (*instances.Record, error) {
	// Nothing is decided on state not yet checked against storage.
	if err := r.awaitVerified(ctx); err != nil {
		return nil, err
	}
	rec, err := r.tenantRecord(tenant, id)
	if err != nil {
		return nil, err
	}
	if rec.GroupID == "" || rec.OnDemand {
		return nil, invalid(config.FieldError{Key: "on_scale_down", Reason: "instance " + id + " is not a member of a group"})
	}
	if !rec.State.Active() || (rec.ScaleDownFirst && rec.ScaleDownSkipDrain == skipDrain) {
		return rec, nil
	}
	rec, err = r.o.Instances.Update(ctx, id, func(x *instances.Record) error {
		if !x.State.Active() {
			return instances.ErrNoChange
		}
		x.ScaleDownFirst, x.ScaleDownSkipDrain = true, skipDrain
		x.UpdatedAt = r.o.Now().UTC()
		return nil
	})
	if errors.Is(err, instances.ErrNotFound) {
		return nil, fmt.Errorf("%w: instance %q", ErrNotFound, id)
	}
	if err != nil {
		return nil, err
	}
	r.enqueueGroup(groups.Key{Tenant: rec.Tenant, ID: rec.GroupID})
	return rec, nil
}

// DeleteInstance starts the deletion of a tenant's instance.
func (r *Reconciler) DeleteInstance(ctx context.Context, tenant, id string, skipDrain bool) (*instances.Record, error) {
	// Nothing is decided on state not yet checked against storage.
	if err := r.awaitVerified(ctx); err != nil {
		return nil, err
	}
	before, err := r.tenantRecord(tenant, id)
	if err != nil {
		return nil, err
	}
	if err := r.beginDeletion(ctx, id, nstancev1.DeletionReason_DELETION_REASON_ON_DEMAND_DELETE, skipDrain, "deletion requested through the API"); err != nil {
		return nil, err
	}
	if rec, ok := r.o.Instances.Get(id); ok {
		return rec, nil
	}
	// Already gone (skip_drain on a fast provider): report it deleted.
	before.State = instances.StateDeleted
	return before, nil
}

// AcknowledgeDrained lets a pending-deletion instance be deleted now.
func (r *Reconciler) AcknowledgeDrained(ctx context.Context, tenant, id string) (*instances.Record, error) {
	// Nothing is decided on state not yet checked against storage.
	if err := r.awaitVerified(ctx); err != nil {
		return nil, err
	}
	rec, err := r.tenantRecord(tenant, id)
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
	rec, err = r.o.Instances.Update(ctx, id, func(x *instances.Record) error {
		if x.State != instances.StatePendingDeletion || x.DrainAcked {
			return instances.ErrNoChange
		}
		x.DrainAcked, x.UpdatedAt = true, r.o.Now().UTC()
		return nil
	})
	if err != nil {
		return nil, err
	}
	r.EnqueueInstance(id)
	return rec, nil
}

// PendingDrains returns a PENDING_DELETION event for every instance of the
// tenant that still waits for a drain acknowledgement, sorted by id. A
// watcher that connects (or reconnects) receives them first, so a drain
// announced while no operator listened is never lost.
func (r *Reconciler) PendingDrains(tenant string) []*nstancev1.InstanceEvent {
	recs := r.o.Instances.List(func(x *instances.Record) bool {
		return x.Tenant == tenant && x.State == instances.StatePendingDeletion && !x.DrainAcked
	})
	out := make([]*nstancev1.InstanceEvent, 0, len(recs))
	for _, rec := range recs {
		ev := &nstancev1.InstanceEvent{
			Status: nstancev1.InstanceEventStatus_INSTANCE_EVENT_STATUS_PENDING_DELETION, Reason: rec.DeletionReason,
			InstanceId: rec.ID, ProviderId: rec.ProviderID, GroupId: rec.GroupID,
			OccurredAt: timestamppb.New(rec.UpdatedAt), Shard: r.o.Shard, Message: rec.Message,
		}
		if rec.DrainDeadline != nil {
			ev.DrainDeadline = timestamppb.New(*rec.DrainDeadline)
		}
		out = append(out, ev)
	}
	return out
}
