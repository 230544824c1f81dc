package operatorsvc

import (
	"context"
	"errors"
	"slices"
	"time"

	"github.com/go-logr/logr"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/nstance-dev/nstance/internal/config"
	"github.com/nstance-dev/nstance/internal/pki"
	"github.com/nstance-dev/nstance/internal/server/authz"
	"github.com/nstance-dev/nstance/internal/server/events"
	"github.com/nstance-dev/nstance/internal/server/instances"
	"github.com/nstance-dev/nstance/internal/server/liveconfig"
	"github.com/nstance-dev/nstance/internal/server/provider"
	"github.com/nstance-dev/nstance/internal/server/reconcile"
	"github.com/nstance-dev/nstance/internal/server/registration"
	"github.com/nstance-dev/nstance/internal/server/revocation"
	"github.com/nstance-dev/nstance/internal/server/tenantops"
	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

// AuthzTenant reads the tenant of an operator (or admin) identity placed by
// the authz interceptors.
func AuthzTenant(ctx context.Context) (string, bool) {
	id, ok := authz.IdentityFrom(ctx)
	if !ok || (id.Role != pki.RoleOperator && id.Role != pki.RoleAdmin) || id.Tenant == "" {
		return "", false
	}
	return id.Tenant, true
}

// Options configures the service.
type Options struct {
	Shard string
	// Reconciler serves groups, instances and the watches; nil answers them
	// Unavailable (a server that runs no fleet).
	Reconciler *reconcile.Reconciler
	// Ops carries out the tenants' group and instance requests.
	Ops *tenantops.Ops
	// Config is the running config (GetConfigStatus, RefreshConfig); nil
	// reports no version and refuses RefreshConfig.
	Config *liveconfig.Holder
	// Issuer signs renewed operator certificates; nil answers
	// RenewCertificate Unimplemented.
	Issuer *registration.Issuer
	// Operators holds the operator records (cluster/operators/):
	// RenewCertificate refuses a caller whose record is missing or names
	// another tenant or role, and records the renewed serial. nstance-server
	// always sets it; only tests of other layers leave it nil.
	Operators *OperatorRecords
	Log       logr.Logger
	// Revocations serves the admin RPCs ListOperators, ListRevocations and
	// Revoke; nil answers them Unimplemented.
	Revocations *revocation.Gate
	// Leadership names the serving server and the start of its term for
	// GetConfigStatus; nil leaves them out.
	Leadership func() (serverID string, since time.Time)
	// InstanceTypes answers DescribeInstanceType (the config's catalog, then
	// the provider's lookup); nil answers it Unimplemented.
	InstanceTypes provider.InstanceTypeDescriber
}

// Service implements nstancev1.OperatorServiceServer.
type Service struct {
	nstancev1.UnimplementedOperatorServiceServer
	o Options
}

var _ nstancev1.OperatorServiceServer = (*Service)(nil)

// New returns the service.
func New(o Options) *Service { return &Service{o: o} }

func (s *Service) tenant(ctx context.Context) (string, error) {
	t, ok := AuthzTenant(ctx)
	if !ok {
		return "", status.Error(codes.Unauthenticated, "no operator identity on the request")
	}
	return t, nil
}

// leaderTenant is tenant plus a check that this server is running its shard.
func (s *Service) leaderTenant(ctx context.Context) (string, error) {
	t, err := s.tenant(ctx)
	if err != nil {
		return "", err
	}
	if s.o.Reconciler == nil || !s.o.Reconciler.Running() {
		return "", status.Errorf(codes.Unavailable, "this server is not the active leader of shard %s", s.o.Shard)
	}
	// A new term serves reads once its state is loaded (from the cache).
	if err := s.o.Reconciler.AwaitLoaded(ctx); err != nil {
		return "", toStatus(err)
	}
	return t, nil
}

// toStatus maps domain errors onto gRPC codes.
func toStatus(err error) error {
	if err == nil {
		return nil
	}
	if _, ok := status.FromError(err); ok && status.Code(err) != codes.Unknown {
		return err
	}
	var inv *tenantops.InvalidError
	switch {
	case errors.As(err, &inv):
		return status.Error(codes.InvalidArgument, err.Error())
	case errors.Is(err, tenantops.ErrNotFound), errors.Is(err, instances.ErrNotFound):
		return status.Error(codes.NotFound, err.Error())
	case errors.Is(err, tenantops.ErrConflict):
		return status.Error(codes.Aborted, err.Error())
	case errors.Is(err, tenantops.ErrNotPermitted):
		return status.Error(codes.FailedPrecondition, err.Error())
	case errors.Is(err, tenantops.ErrDenied):
		return status.Error(codes.PermissionDenied, err.Error())
	case errors.Is(err, tenantops.ErrQuota):
		return status.Error(codes.ResourceExhausted, err.Error())
	case errors.Is(err, context.Canceled):
		return status.Error(codes.Canceled, err.Error())
	case errors.Is(err, context.DeadlineExceeded):
		return status.Error(codes.DeadlineExceeded, err.Error())
	}
	return status.Error(codes.Unavailable, err.Error())
}

// GetConfigStatus implements the RPC.
func (s *Service) GetConfigStatus(ctx context.Context, _ *nstancev1.GetConfigStatusRequest) (*nstancev1.GetConfigStatusResponse, error) {
	if _, err := s.tenant(ctx); err != nil {
		return nil, err
	}
	resp := &nstancev1.GetConfigStatusResponse{Shard: s.o.Shard}
	if s.o.Config != nil {
		etag, mod := s.o.Config.ConfigVersion()
		resp.Etag = etag
		if !mod.IsZero() {
			resp.LastModified = timestamppb.New(mod)
		}
	}
	if s.o.Leadership != nil {
		id, since := s.o.Leadership()
		resp.ServerId = id
		if !since.IsZero() {
			resp.LeaderSince = timestamppb.New(since)
		}
	}
	return resp, nil
}

// RefreshConfig implements the RPC. It is an admin action: the config is
// shard-wide, so an operator of one tenant may not swap it. Invalid and
// unreadable configs are never applied; their error is reported to the
// calling admin's tenant only.
func (s *Service) RefreshConfig(ctx context.Context, _ *nstancev1.RefreshConfigRequest) (*nstancev1.RefreshConfigResponse, error) {
	t, err := s.tenant(ctx)
	if err != nil {
		return nil, err
	}
	if _, err := authz.RequireRole(ctx, pki.RoleAdmin); err != nil {
		return nil, err
	}
	if s.o.Config == nil || s.o.Reconciler == nil {
		return nil, status.Errorf(codes.Unavailable, "this server does not run the config of shard %s", s.o.Shard)
	}
	res := s.o.Config.Refresh(ctx)
	resp := &nstancev1.RefreshConfigResponse{Etag: res.ETag, PreviousEtag: res.PreviousETag, Message: res.Message}
	switch res.Outcome {
	case liveconfig.Updated:
		resp.Outcome = nstancev1.RefreshConfigOutcome_REFRESH_CONFIG_OUTCOME_UPDATED
	case liveconfig.NotModified:
		resp.Outcome = nstancev1.RefreshConfigOutcome_REFRESH_CONFIG_OUTCOME_NOT_MODIFIED
	case liveconfig.Invalid:
		resp.Outcome = nstancev1.RefreshConfigOutcome_REFRESH_CONFIG_OUTCOME_INVALID
		resp.ValidationErrors = validationErrors(res.Errors)
		s.o.Reconciler.ReportConfigError(t, errors.New(res.Message))
	case liveconfig.StorageError:
		resp.Outcome = nstancev1.RefreshConfigOutcome_REFRESH_CONFIG_OUTCOME_STORAGE_ERROR
		s.o.Reconciler.ReportConfigError(t, errors.New(res.Message))
	}
	return resp, nil
}

func validationErrors(fes []config.FieldError) []*nstancev1.ValidationError {
	out := make([]*nstancev1.ValidationError, 0, len(fes))
	for _, fe := range fes {
		out = append(out, &nstancev1.ValidationError{Key: fe.Key, Reason: fe.Reason})
	}
	return out
}

// ListGroups implements the RPC.
func (s *Service) ListGroups(ctx context.Context, _ *nstancev1.ListGroupsRequest) (*nstancev1.ListGroupsResponse, error) {
	t, err := s.leaderTenant(ctx)
	if err != nil {
		return nil, err
	}
	return &nstancev1.ListGroupsResponse{Groups: s.o.Ops.ListGroups(t)}, nil
}

// UpsertGroup implements the RPC.
func (s *Service) UpsertGroup(ctx context.Context, req *nstancev1.UpsertGroupRequest) (*nstancev1.UpsertGroupResponse, error) {
	t, err := s.leaderTenant(ctx)
	if err != nil {
		return nil, err
	}
	g, created, err := s.o.Ops.UpsertGroup(ctx, t, req.GetGroup(), req.GetExpectedEtag())
	if err != nil {
		return nil, toStatus(err)
	}
	return &nstancev1.UpsertGroupResponse{Group: g, Created: created}, nil
}

// DeleteGroup implements the RPC.
func (s *Service) DeleteGroup(ctx context.Context, req *nstancev1.DeleteGroupRequest) (*nstancev1.DeleteGroupResponse, error) {
	t, err := s.leaderTenant(ctx)
	if err != nil {
		return nil, err
	}
	n, err := s.o.Ops.DeleteGroup(ctx, t, req.GetGroupId(), req.GetExpectedEtag())
	if err != nil {
		return nil, toStatus(err)
	}
	return &nstancev1.DeleteGroupResponse{GroupId: req.GetGroupId(), InstancesToDelete: uint32(n)}, nil
}

// CreateInstance implements the RPC.
func (s *Service) CreateInstance(ctx context.Context, req *nstancev1.CreateInstanceRequest) (*nstancev1.CreateInstanceResponse, error) {
	t, err := s.leaderTenant(ctx)
	if err != nil {
		return nil, err
	}
	cr := tenantops.CreateInstanceRequest{GroupID: req.GetGroupId(), Template: req.GetTemplate(), InstanceType: req.GetInstanceType(),
		SubnetPool: req.GetSubnetPool(), ClientToken: req.GetClientToken(), Vars: req.GetVars(), Labels: req.GetLabels(),
		UserData: req.GetUserData(), UserDataFormat: req.GetUserDataFormat(), Image: req.GetImage()}
	if d := req.GetDrainTimeout(); d != nil {
		if err := d.CheckValid(); err != nil {
			return nil, status.Errorf(codes.InvalidArgument, "drain_timeout: %v", err)
		}
		cr.DrainTimeout = new(d.AsDuration())
	}
	rec, err := s.o.Ops.CreateInstance(ctx, t, cr)
	if err != nil {
		return nil, toStatus(err)
	}
	return &nstancev1.CreateInstanceResponse{Instance: rec.Proto()}, nil
}

// DeleteInstance implements the RPC.
func (s *Service) DeleteInstance(ctx context.Context, req *nstancev1.DeleteInstanceRequest) (*nstancev1.DeleteInstanceResponse, error) {
	t, err := s.leaderTenant(ctx)
	if err != nil {
		return nil, err
	}
	del := s.o.Ops.DeleteInstance
	if req.GetOnScaleDown() {
		del = s.o.Ops.MarkForScaleDown
	}
	rec, err := del(ctx, t, req.GetInstanceId(), req.GetSkipDrain())
	if err != nil {
		return nil, toStatus(err)
	}
	return &nstancev1.DeleteInstanceResponse{Instance: rec.Proto()}, nil
}

// GetInstanceStatus implements the RPC.
func (s *Service) GetInstanceStatus(ctx context.Context, req *nstancev1.GetInstanceStatusRequest) (*nstancev1.GetInstanceStatusResponse, error) {
	t, err := s.leaderTenant(ctx)
	if err != nil {
		return nil, err
	}
	if req.GetInstanceId() == "" && req.GetClientToken() == "" {
		return nil, status.Error(codes.InvalidArgument, "lookup: instance_id or client_token is required")
	}
	rec, err := s.o.Ops.GetInstance(t, req.GetInstanceId(), req.GetClientToken())
	if err != nil {
		return nil, toStatus(err)
	}
	return &nstancev1.GetInstanceStatusResponse{Instance: s.o.Ops.StatusWithHealth(rec)}, nil
}

// ListInstances implements the RPC.
func (s *Service) ListInstances(ctx context.Context, req *nstancev1.ListInstancesRequest) (*nstancev1.ListInstancesResponse, error) {
	t, err := s.leaderTenant(ctx)
	if err != nil {
		return nil, err
	}
	for _, st := range req.GetStates() {
		if _, known := nstancev1.InstanceState_name[int32(st)]; !known || st == nstancev1.InstanceState_INSTANCE_STATE_UNSPECIFIED {
			return nil, status.Errorf(codes.InvalidArgument, "states: %v is not an instance state", st)
		}
	}
	return &nstancev1.ListInstancesResponse{Instances: s.o.Ops.ListInstances(t, req.GetGroupIds(), req.GetStates(), req.GetWithHealth())}, nil
}

// AcknowledgeDrained implements the RPC.
func (s *Service) AcknowledgeDrained(ctx context.Context, req *nstancev1.AcknowledgeDrainedRequest) (*nstancev1.AcknowledgeDrainedResponse, error) {
	t, err := s.leaderTenant(ctx)
	if err != nil {
		return nil, err
	}
	rec, err := s.o.Ops.AcknowledgeDrained(ctx, t, req.GetInstanceId())
	if err != nil {
		return nil, toStatus(err)
	}
	return &nstancev1.AcknowledgeDrainedResponse{Instance: rec.Proto()}, nil
}

func endOf[T any](sub *events.Sub[T]) error {
	err := sub.Err()
	if errors.Is(err, events.ErrSlow) {
		return status.Error(codes.ResourceExhausted, err.Error())
	}
	return status.Error(codes.Unavailable, "server is shutting down or lost leadership; reconnect")
}

func wanted(filter []string, id string) bool { return len(filter) == 0 || slices.Contains(filter, id) }

// WatchGroups implements the RPC: a snapshot of UPSERT events, then changes.
// Like the other watch streams it sends response headers (nstance-shard) once
// subscribed, so a client that waits for them misses no later event.
func (s *Service) WatchGroups(req *nstancev1.WatchGroupsRequest, stream nstancev1.OperatorService_WatchGroupsServer) error {
	ctx := stream.Context()
	t, err := s.leaderTenant(ctx)
	if err != nil {
		return err
	}
	// Subscribe before the snapshot so no change falls in between; a change
	// may then arrive twice, which UPSERT semantics make harmless.
	sub := s.o.Reconciler.Events().Groups.Subscribe(t)
	defer sub.Close()
	// The header tells the client the subscription is in place: every
	// event after this point reaches it.
	if err := stream.SendHeader(metadata.Pairs("nstance-shard", s.o.Shard)); err != nil {
		return err
	}
	now := timestamppb.Now()
	for _, g := range s.o.Ops.ListGroups(t) {
		if !wanted(req.GetGroupIds(), g.GetSpec().GetGroupId()) {
			continue
		}
		if err := stream.Send(&nstancev1.GroupEvent{Type: nstancev1.GroupEventType_GROUP_EVENT_TYPE_UPSERT, GroupId: g.GetSpec().GetGroupId(),
			Group: g, Snapshot: true, OccurredAt: now, Shard: s.o.Shard}); err != nil {
			return err
		}
	}
	return pump(ctx, sub, func(ev *nstancev1.GroupEvent) error {
		if !wanted(req.GetGroupIds(), ev.GetGroupId()) {
			return nil
		}
		return stream.Send(ev)
	})
}

// pump sends a subscription's events until the client goes away or the
// subscription is closed (then what it still buffered is sent first).
func pump[T any](ctx context.Context, sub *events.Sub[T], send func(T) error) error {
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev := <-sub.Events():
			if err := send(ev); err != nil {
				return err
			}
		case <-sub.Done():
			return flush(sub, send)
		}
	}
}

// flush sends what a closed subscription still buffered, then ends the stream.
func flush[T any](sub *events.Sub[T], send func(T) error) error {
	for {
		select {
		case ev := <-sub.Events():
			if err := send(ev); err != nil {
				return err
			}
		default:
			return endOf(sub)
		}
	}
}

// WatchInstances implements the RPC: PENDING_DELETION events for every
// instance still awaiting a drain acknowledgement, then changes.
func (s *Service) WatchInstances(req *nstancev1.WatchInstancesRequest, stream nstancev1.OperatorService_WatchInstancesServer) error {
	ctx := stream.Context()
	t, err := s.leaderTenant(ctx)
	if err != nil {
		return err
	}
	sub := s.o.Reconciler.Events().Instances.Subscribe(t)
	defer sub.Close()
	// The header tells the client the subscription is in place: every
	// event after this point reaches it.
	if err := stream.SendHeader(metadata.Pairs("nstance-shard", s.o.Shard)); err != nil {
		return err
	}
	send := func(ev *nstancev1.InstanceEvent) error {
		if !wanted(req.GetGroupIds(), ev.GetGroupId()) {
			return nil
		}
		return stream.Send(ev)
	}
	// Re-announce every drain still waiting for an acknowledgement: an
	// operator that was down or reconnecting when the PENDING_DELETION
	// event was published would otherwise never acknowledge it. Subscribing
	// first means a deletion may be announced twice, never missed.
	for _, ev := range s.o.Ops.PendingDrains(t) {
		if err := send(ev); err != nil {
			return err
		}
	}
	return pump(ctx, sub, send)
}

// WatchErrors implements the RPC.
func (s *Service) WatchErrors(req *nstancev1.WatchErrorsRequest, stream nstancev1.OperatorService_WatchErrorsServer) error {
	ctx := stream.Context()
	t, err := s.leaderTenant(ctx)
	if err != nil {
		return err
	}
	sub := s.o.Reconciler.Events().Errors.Subscribe(t)
	defer sub.Close()
	// The header tells the client the subscription is in place: every
	// event after this point reaches it.
	if err := stream.SendHeader(metadata.Pairs("nstance-shard", s.o.Shard)); err != nil {
		return err
	}
	send := func(ev *nstancev1.ErrorEvent) error {
		if ev.GetGroupId() != "" && !wanted(req.GetGroupIds(), ev.GetGroupId()) {
			return nil
		}
		if len(req.GetSources()) > 0 && !slices.Contains(req.GetSources(), ev.GetSource()) {
			return nil
		}
		return stream.Send(ev)
	}
	return pump(ctx, sub, send)
}
