package tenantops

import (
	"sync"
	"time"

	"github.com/nstance-dev/nstance/internal/config"
	"github.com/nstance-dev/nstance/internal/server/groups"
	"github.com/nstance-dev/nstance/internal/server/instances"
	"github.com/nstance-dev/nstance/internal/server/reconcile"
	"github.com/nstance-dev/nstance/internal/server/userdata"
)

// Options configures Ops.
type Options struct {
	Shard string
	// Config returns the running config.
	Config     func() *config.Config
	Groups     *groups.Registry
	Instances  *instances.Store
	Reconciler *reconcile.Reconciler
	// UserData stores the bootstrap data tenants send (nil: refused).
	UserData *userdata.Store
	// Now defaults to time.Now.
	Now func() time.Time
}

// Ops serves the tenants of one shard.
type Ops struct {
	o Options
	// tokenMu serialises CreateInstance's client-token lookup with the
	// record's creation, so two calls with one token make one instance.
	tokenMu sync.Mutex
}

// New returns the operations of one shard.
func New(o Options) *Ops {
	if o.Now == nil {
		o.Now = time.Now
	}
	return &Ops{o: o}
}
