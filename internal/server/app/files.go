package app

import (
	"github.com/go-logr/logr"

	"github.com/nstance-dev/nstance/internal/config"
	"github.com/nstance-dev/nstance/internal/secrets"
	"github.com/nstance-dev/nstance/internal/server/agentapi"
	"github.com/nstance-dev/nstance/internal/server/liveconfig"
)

// fileSources builds what template files of kind secret and storage are
// read with: the shard's store for objects, the store with the cluster
// keyring for file secrets (as bootstrap reads cluster/secret/ca.key), and
// the AWS clients, with the cache settings of the live config.
func fileSources(p Parts, holder *liveconfig.Holder, maxBytes int, log logr.Logger) *agentapi.FileSources {
	fs := &agentapi.FileSources{Objects: p.Store, Keys: p.Keys, Remote: p.Remote, MaxBytes: maxBytes,
		Settings: func() config.FileSources { return holder.Current().Shard.FileSources },
		Now:      p.Tuning.Now, Log: log.WithName("filesources")}
	if p.Ring != nil && p.Store != nil {
		fs.Secrets = &secrets.Store{Objects: p.Store, Ring: p.Ring}
	}
	return fs
}
