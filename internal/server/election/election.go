package election

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/go-logr/logr"

	"github.com/nstance-dev/nstance/internal/config"
	"github.com/nstance-dev/nstance/pkg/objstore"
)

// Lease is the stored lease document.
type Lease struct {
	Holder string `json:"holder"`
	// Incarnation is random per process: it tells a holder's own lease from
	// one written by another process with the same server id.
	Incarnation string    `json:"incarnation,omitempty"`
	RenewedAt   time.Time `json:"renewed_at"`
	ExpiresAt   time.Time `json:"expires_at"`
	Term        int64     `json:"term"`
}

// ErrDuplicateID is returned by Run when another live process holds the
// lease under this candidate's id: two servers were given the same id.
var ErrDuplicateID = errors.New("another running server uses this server id")

// Config configures an Elector.
type Config struct {
	Store objstore.Store
	// Key is the lease object key.
	Key string
	// ID identifies this candidate (the server id).
	ID string
	// Incarnation identifies this process; a random value when empty.
	Incarnation   string
	LeaseDuration time.Duration
	// RenewDeadline is how long a leader may go without a successful
	// renewal before it stops acting. It is strictly shorter than
	// LeaseDuration: the leader gives up its work while the lease it last
	// wrote is still valid on any clock within MaxClockSkew of its own.
	// Zero means two thirds of the lease (at least the renew interval).
	RenewDeadline time.Duration
	// MaxClockSkew is the stated bound on the difference between the
	// candidates' clocks. A standby takes a lease over only after it stayed
	// unchanged for LeaseDuration+MaxClockSkew on its own clock, or once it
	// expired by more than MaxClockSkew.
	MaxClockSkew  time.Duration
	RenewInterval time.Duration
	RetryInterval time.Duration
	Log           logr.Logger
	// OnLeading runs while this candidate leads; its context is cancelled as
	// soon as leadership is lost or Run ends. Run waits for it to return
	// before campaigning again.
	OnLeading func(ctx context.Context, term int64)
	// Now returns the current time; time.Now when nil.
	Now func() time.Time
}

// Status is a snapshot of what an Elector knows.
type Status struct {
	Leading bool
	// Holder is the last holder seen in storage.
	Holder string
	Term   int64
	// ETag is the fencing token of our lease while leading.
	ETag string
	// ValidUntil is when this leader stops acting unless it renews first:
	// the start of its last successful renewal plus the renew deadline.
	ValidUntil time.Time
	// LastContact is when storage last answered a lease read or write
	// (a missing lease and a lost conditional write are answers too): a
	// server whose storage went away sees it stop moving.
	LastContact time.Time
}

// ErrNotLeader is returned by Check when this candidate may not act as the
// leader (of the given term).
var ErrNotLeader = errors.New("not the leader")

// Elector campaigns for one lease.
type Elector struct {
	cfg Config

	mu     sync.Mutex
	status Status
}

// New checks cfg and returns an Elector.
func New(cfg Config) (*Elector, error) {
	switch {
	case cfg.Store == nil:
		return nil, errors.New("election: store is required")
	case cfg.Key == "" || cfg.ID == "":
		return nil, errors.New("election: key and id are required")
	case cfg.LeaseDuration <= 0 || cfg.RenewInterval <= 0 || cfg.RetryInterval <= 0:
		return nil, errors.New("election: lease, renew and retry durations must be positive")
	case cfg.RenewInterval >= cfg.LeaseDuration:
		return nil, fmt.Errorf("election: renew interval %s must be shorter than lease %s", cfg.RenewInterval, cfg.LeaseDuration)
	case cfg.MaxClockSkew < 0:
		return nil, fmt.Errorf("election: max clock skew %s must not be negative", cfg.MaxClockSkew)
	}
	if cfg.RenewDeadline == 0 {
		cfg.RenewDeadline = config.DefaultRenewDeadline(cfg.LeaseDuration, cfg.RenewInterval)
	}
	if cfg.RenewDeadline <= cfg.RenewInterval || cfg.RenewDeadline >= cfg.LeaseDuration {
		return nil, fmt.Errorf("election: renew deadline %s must be longer than the renew interval %s and shorter than the lease %s",
			cfg.RenewDeadline, cfg.RenewInterval, cfg.LeaseDuration)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Incarnation == "" {
		inc, err := NewIncarnation()
		if err != nil {
			return nil, err
		}
		cfg.Incarnation = inc
	}
	if cfg.OnLeading == nil {
		cfg.OnLeading = func(ctx context.Context, _ int64) { <-ctx.Done() }
	}
	return &Elector{cfg: cfg}, nil
}

// NewIncarnation returns a random process incarnation id.
func NewIncarnation() (string, error) {
	b := make([]byte, 8)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("election: incarnation: %w", err)
	}
	return hex.EncodeToString(b), nil
}

// Incarnation is the id of this process in the lease.
func (e *Elector) Incarnation() string { return e.cfg.Incarnation }

// Status returns the current state. Leading is false once ValidUntil has
// passed, even before the renewal loop has noticed (a process resumed after
// SIGSTOP must not act on a lease that may belong to another by now).
func (e *Elector) Status() Status {
	e.mu.Lock()
	st := e.status
	e.mu.Unlock()
	if st.Leading && !e.cfg.Now().Before(st.ValidUntil) {
		st.Leading, st.ETag = false, ""
	}
	return st
}

// Leading reports whether this candidate currently holds the lease and
// may act on it.
func (e *Elector) Leading() bool { return e.Status().Leading }

// Check returns nil when this candidate may act as the leader of term
// (any term when term is 0), and an error wrapping ErrNotLeader otherwise.
// Every state-changing write and provider call of a leader passes it.
func (e *Elector) Check(term int64) error {
	st := e.Status()
	switch {
	case !st.Leading:
		return fmt.Errorf("%w of %s", ErrNotLeader, e.cfg.Key)
	case term != 0 && st.Term != term:
		return fmt.Errorf("%w of %s in term %d (now term %d)", ErrNotLeader, e.cfg.Key, term, st.Term)
	}
	return nil
}

// Bound returns ctx limited to this leader's validity: work started under
// it is cancelled when the leader would stop acting. It returns an error
// wrapping ErrNotLeader, and a cancelled context, when not leading.
func (e *Elector) Bound(ctx context.Context) (context.Context, context.CancelFunc, error) {
	st := e.Status()
	if !st.Leading {
		ctx, cancel := context.WithCancel(ctx)
		cancel()
		return ctx, cancel, fmt.Errorf("%w of %s", ErrNotLeader, e.cfg.Key)
	}
	c, cancel := context.WithTimeout(ctx, st.ValidUntil.Sub(e.cfg.Now()))
	return c, cancel, nil
}

func (e *Elector) set(f func(*Status)) {
	e.mu.Lock()
	f(&e.status)
	e.mu.Unlock()
}

// observation tracks how long a foreign lease has stayed unchanged.
type observation struct {
	etag  string
	since time.Time
	// twin is set while the observed lease names this candidate's id but
	// another incarnation.
	twin string
}

// Run campaigns until ctx ends; when leading it renews and calls OnLeading.
// On return the lease is released if held. It returns ErrDuplicateID (and
// campaigns no more) when it sees a lease held under its own id by another
// process that is alive, i.e. renews it.
func (e *Elector) Run(ctx context.Context) error {
	var obs observation
	for {
		lease, etag, ok, err := e.tryAcquire(ctx, &obs)
		if err != nil {
			e.cfg.Log.Error(err, "refusing to campaign", "key", e.cfg.Key, "id", e.cfg.ID, "incarnation", e.cfg.Incarnation)
			return err
		}
		if ok {
			e.lead(ctx, lease, etag, lease.RenewedAt)
			obs = observation{}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(e.cfg.RetryInterval):
		}
	}
}

// contacted records that storage answered (err is nil or an answer).
func (e *Elector) contacted(err error) {
	if err == nil || errors.Is(err, objstore.ErrNotFound) || errors.Is(err, objstore.ErrPreconditionFailed) {
		now := e.cfg.Now()
		e.set(func(s *Status) { s.LastContact = now })
	}
}

func (e *Elector) read(ctx context.Context) (*Lease, string, error) {
	obj, err := e.cfg.Store.Get(ctx, e.cfg.Key)
	e.contacted(err)
	if err != nil {
		return nil, "", err
	}
	var l Lease
	if err := json.Unmarshal(obj.Body, &l); err != nil {
		// A lease that cannot be read is never treated as released: it
		// may be a newer format written by a leader that is alive.
		return nil, "", fmt.Errorf("lease %s is not valid JSON (%d bytes; an operator must inspect and delete it): %w", e.cfg.Key, len(obj.Body), err)
	}
	return &l, obj.ETag, nil
}

func (e *Elector) write(ctx context.Context, l Lease, opts objstore.PutOptions) (string, error) {
	body, err := json.Marshal(l)
	if err != nil {
		return "", err
	}
	etag, err := e.cfg.Store.Put(ctx, e.cfg.Key, body, opts)
	e.contacted(err)
	return etag, err
}

// tryAcquire reads the lease and takes it when it is free or dead. The time
// is taken after the read returns: a read that blocked (a partition) must
// not make a lease look unchanged for longer than it was seen, and the new
// lease's timestamps (and the leader's validity, from RenewedAt) are still
// earlier than the write that makes them visible.
func (e *Elector) tryAcquire(ctx context.Context, obs *observation) (Lease, string, bool, error) {
	cur, etag, err := e.read(ctx)
	now := e.cfg.Now()
	var opts objstore.PutOptions
	takeover := "a new lease"
	next := Lease{Holder: e.cfg.ID, Incarnation: e.cfg.Incarnation, RenewedAt: now.UTC(), ExpiresAt: now.Add(e.cfg.LeaseDuration).UTC(), Term: 1}
	switch {
	case errors.Is(err, objstore.ErrNotFound):
		opts.IfNoneMatch = true
	case err != nil:
		if ctx.Err() == nil {
			e.cfg.Log.Error(err, "reading lease failed", "key", e.cfg.Key)
		}
		return Lease{}, "", false, nil
	default:
		e.set(func(s *Status) { s.Holder, s.Term = cur.Holder, cur.Term })
		twin := ""
		if cur.Holder == e.cfg.ID && cur.Incarnation != e.cfg.Incarnation {
			twin = cur.Incarnation
			if twin == "" {
				twin = "(none)"
			}
		}
		if obs.etag != etag {
			if obs.etag != "" && twin != "" && obs.twin == twin {
				// The lease under our id was renewed by its other incarnation:
				// that process is alive, so two servers share this id.
				return Lease{}, "", false, fmt.Errorf("%w: %q holds %s (incarnation %s, renewed at %s); give each server its own --id",
					ErrDuplicateID, e.cfg.ID, e.cfg.Key, twin, cur.RenewedAt.Format(time.RFC3339Nano))
			}
			*obs = observation{etag: etag, since: now, twin: twin}
		}
		// Our own lease (same incarnation) is ours to take back. A lease
		// under our id from another incarnation is treated like anyone
		// else's: a previous run of this server that crashed leaves it
		// unchanged, and it is taken over after a lease.
		//
		// Otherwise the lease is dead once it stayed unchanged for a lease
		// plus the clock-skew allowance on our clock, or expired by more
		// than that allowance by the holder's clock. The holder stopped
		// acting RenewDeadline after the start of its last renewal, which
		// is earlier than either.
		var why string
		switch {
		case cur.Holder == "":
			why = "released"
		case cur.Holder == e.cfg.ID && cur.Incarnation == e.cfg.Incarnation:
			why = "our own"
		case now.Sub(obs.since) >= e.cfg.LeaseDuration+e.cfg.MaxClockSkew:
			why = fmt.Sprintf("unchanged for %s", now.Sub(obs.since))
		case now.After(cur.ExpiresAt.Add(e.cfg.MaxClockSkew)):
			why = fmt.Sprintf("expired at %s", cur.ExpiresAt.Format(time.RFC3339Nano))
		default:
			return Lease{}, "", false, nil
		}
		takeover = fmt.Sprintf("%s's lease of term %d: %s", cur.Holder, cur.Term, why)
		opts.IfMatch = etag
		next.Term = cur.Term + 1
	}
	newTag, err := e.write(ctx, next, opts)
	if err != nil {
		if !errors.Is(err, objstore.ErrPreconditionFailed) && ctx.Err() == nil {
			e.cfg.Log.Error(err, "writing lease failed", "key", e.cfg.Key)
		}
		return Lease{}, "", false, nil
	}
	e.cfg.Log.Info("acquired leadership", "key", e.cfg.Key, "term", next.Term, "incarnation", e.cfg.Incarnation, "took", takeover)
	return next, newTag, true, nil
}

// lead renews the lease and runs OnLeading until leadership ends. It stops
// acting (cancels OnLeading's context; Status and Check say not leading)
// no later than RenewDeadline after the start of its last successful
// renewal, however long a storage write blocks.
func (e *Elector) lead(ctx context.Context, lease Lease, etag string, began time.Time) {
	validUntil := began.Add(e.cfg.RenewDeadline)
	e.set(func(s *Status) {
		*s = Status{Leading: true, Holder: e.cfg.ID, Term: lease.Term, ETag: etag, ValidUntil: validUntil}
	})
	leadCtx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		e.cfg.OnLeading(leadCtx, lease.Term)
	}()
	// expiry fires at validUntil by the real clock; e.cfg.Now (possibly a
	// test clock) is the authority, so a firing re-checks it.
	expiry := time.NewTimer(validUntil.Sub(e.cfg.Now()))
	defer expiry.Stop()
	ticker := time.NewTicker(e.cfg.RenewInterval)
	defer ticker.Stop()
	reason := "context ended"
loop:
	for {
		select {
		case <-ctx.Done():
			break loop
		case <-done:
			reason = "leader work returned"
			break loop
		case <-expiry.C:
			if !e.cfg.Now().Before(validUntil) {
				reason = "could not renew within the renew deadline"
				break loop
			}
			expiry.Reset(validUntil.Sub(e.cfg.Now()))
			continue
		case <-ticker.C:
		}
		now := e.cfg.Now()
		if !now.Before(validUntil) {
			reason = "could not renew within the renew deadline"
			break loop
		}
		next := Lease{Holder: e.cfg.ID, Incarnation: e.cfg.Incarnation, RenewedAt: now.UTC(), ExpiresAt: now.Add(e.cfg.LeaseDuration).UTC(), Term: lease.Term}
		// The write may not outlive our validity: a renewal that lands
		// after we stopped acting would extend a lease nobody serves.
		rctx, rcancel := context.WithTimeout(ctx, min(e.cfg.RenewInterval, validUntil.Sub(now)))
		newTag, err := e.write(rctx, next, objstore.PutOptions{IfMatch: etag})
		rcancel()
		switch {
		case err == nil:
			etag, validUntil = newTag, now.Add(e.cfg.RenewDeadline)
			e.set(func(s *Status) { s.ETag, s.ValidUntil = etag, validUntil })
			expiry.Reset(validUntil.Sub(e.cfg.Now()))
		case errors.Is(err, objstore.ErrPreconditionFailed):
			reason = "lease was taken over"
			break loop
		case ctx.Err() != nil:
			break loop
		default:
			e.cfg.Log.Error(err, "renewing lease", "key", e.cfg.Key, "validUntil", validUntil)
			if !e.cfg.Now().Before(validUntil) {
				reason = "could not renew within the renew deadline"
				break loop
			}
		}
	}
	if reason == "context ended" {
		// Shutting down: the work may finish gracefully while the lease
		// still lets us act (Status bounds that by ValidUntil), then the
		// lease is released for a standby.
		cancel()
		<-done
		e.set(func(s *Status) { s.Leading = false; s.ETag = "" })
	} else {
		e.set(func(s *Status) { s.Leading = false; s.ETag = "" })
		cancel()
		<-done
	}
	if reason == "context ended" || reason == "leader work returned" {
		e.release(etag, lease.Term)
	}
	e.cfg.Log.Info("lost leadership", "key", e.cfg.Key, "term", lease.Term, "reason", reason)
}

// release marks the lease free so a standby can take over without waiting.
func (e *Elector) release(etag string, term int64) {
	ctx, cancel := context.WithTimeout(context.Background(), e.cfg.RenewInterval)
	defer cancel()
	now := e.cfg.Now().UTC()
	if _, err := e.write(ctx, Lease{RenewedAt: now, ExpiresAt: now, Term: term}, objstore.PutOptions{IfMatch: etag}); err != nil {
		e.cfg.Log.Error(err, "releasing lease failed", "key", e.cfg.Key)
	}
}
