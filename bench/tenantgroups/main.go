// Command tenantgroups measures whether one tenant at its group limits
// slows another tenant's UpsertGroup (issue 29 finding 3). While every
// dynamic group of a shard lived in one document, groups/{shard}.jsonc,
// rewritten on every group write, tenant A's bytes were written again with
// each of tenant B's upserts; now each tenant has its own document.
//
//	go run ./bench/tenantgroups -stores dir,s3 -upserts 200
//
// Two shards run side by side in one process, each a real assembly
// (app.Assemble: Operator operations, reconciler, SQLite cache mirroring
// the groups document) on its own store: "quiet", where tenant A has no
// groups, and "loaded", where tenant A filled shard.limits.max_tenant_group_bytes
// with groups at the largest size the value limits allow (63 vars of
// max_var_value_bytes), then one smaller group up to the limit. Tenant B
// has 10 small groups on both; it then upserts one of them (a changed var)
// -upserts times on each shard, the two shards alternating call by call
// (order swapped every call), so both see the same background load. The
// medians and their ratio are printed per store: dir (directory store) and
// s3 (dev-s3 in process over the AWS SDK, the production path).
package main

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"strings"
	"time"

	"github.com/nstance-dev/nstance/internal/config"
	"github.com/nstance-dev/nstance/internal/devs3/devs3test"
	"github.com/nstance-dev/nstance/internal/layout"
	"github.com/nstance-dev/nstance/internal/server/app"
	"github.com/nstance-dev/nstance/internal/server/cache"
	"github.com/nstance-dev/nstance/internal/server/provider/mock"
	"github.com/nstance-dev/nstance/internal/server/shardtest"
	"github.com/nstance-dev/nstance/internal/server/tenantops"
	"github.com/nstance-dev/nstance/pkg/objstore"
	"github.com/nstance-dev/nstance/pkg/objstore/dirstore"
	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

const (
	shard   = "bench-1"
	tenantA = "tenant-a"
	tenantB = "tenant-b"
)

func main() {
	storeList := flag.String("stores", "dir,s3", "dir (directory store) and/or s3 (in-process dev-s3 over the AWS SDK)")
	upserts := flag.Int("upserts", 200, "tenant B upserts per shard (the median is reported)")
	total := flag.Int("max-tenant-group-bytes", 0, "shard.limits.max_tenant_group_bytes (0: the default)")
	cpuProfile := flag.String("cpuprofile", "", "write a CPU profile of the whole run to this file")
	flag.Parse()
	ctx := context.Background()
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err == nil {
			err = pprof.StartCPUProfile(f)
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "tenantgroups bench: -cpuprofile: %v\n", err)
			os.Exit(2)
		}
	}
	failed := false
	for _, kind := range strings.Split(*storeList, ",") {
		if err := bench(ctx, strings.TrimSpace(kind), *upserts, *total); err != nil {
			fmt.Fprintf(os.Stderr, "tenantgroups bench (%s): %v\n", kind, err)
			failed = true
			break
		}
	}
	pprof.StopCPUProfile() // a no-op without -cpuprofile
	if failed {
		os.Exit(1)
	}
}

// env is one shard: its store, cache and running assembly.
type env struct {
	name  string
	dir   string
	store objstore.Store
	cache *cache.Cache
	f     *app.Assembly
	stop  []func()
}

func (e *env) close() {
	for i := len(e.stop) - 1; i >= 0; i-- {
		e.stop[i]()
	}
	_ = os.RemoveAll(e.dir)
}

func open(ctx context.Context, kind, name string, cfg *config.Config) (*env, error) {
	dir, err := os.MkdirTemp("", "bench-tenantgroups-")
	if err != nil {
		return nil, err
	}
	e := &env{name: name, dir: dir}
	bucket := filepath.Join(dir, "bucket")
	if err := os.MkdirAll(bucket, 0o755); err != nil {
		return nil, err
	}
	switch kind {
	case "dir":
		if e.store, err = dirstore.Open(bucket); err != nil {
			return nil, err
		}
	case "s3":
		st, stop, err := devs3test.Serve(ctx, bucket, 16)
		if err != nil {
			return nil, err
		}
		e.store = st
		e.stop = append(e.stop, stop)
	default:
		return nil, fmt.Errorf("unknown store %q (want dir or s3)", kind)
	}
	if e.cache, err = cache.Open(ctx, filepath.Join(dir, "cache", shard+".sqlite")); err != nil {
		return nil, err
	}
	e.stop = append(e.stop, func() { _ = e.cache.Close() })
	_, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, err
	}
	if e.f, err = app.Assemble(app.Parts{Config: cfg, ConfigETag: "e1", Store: e.store, Keys: layout.New(""), Provider: mock.New(),
		NonceKey: key, Cache: e.cache, Tuning: app.Tuning{ResyncInterval: time.Hour}}); err != nil {
		return nil, err
	}
	lctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- e.f.Lead(lctx) }()
	e.stop = append(e.stop, func() { cancel(); <-done })
	vctx, vcancel := context.WithTimeout(ctx, time.Minute)
	defer vcancel()
	if err := e.f.Reconciler.AwaitVerified(vctx); err != nil {
		return nil, fmt.Errorf("%s: the reconciler did not start: %w", name, err)
	}
	for i := range 10 {
		if _, _, err := e.f.Ops.UpsertGroup(ctx, tenantB, &nstancev1.GroupSpec{GroupId: fmt.Sprintf("b%d", i), Template: "worker",
			Vars: map[string]string{"team": "b", "rev": "0"}}, ""); err != nil {
			return nil, err
		}
	}
	return e, nil
}

// fill gives tenant A groups at the largest size the value limits allow
// until the shard refuses one, then one group of as many such vars as
// still fit. It returns A's groups and the document's size.
func (e *env) fill(ctx context.Context, lim config.Limits) (int, int, error) {
	value := strings.Repeat("a", lim.MaxVarValueBytes)
	vars := func(n int) map[string]string {
		m := map[string]string{}
		for i := range n {
			m[fmt.Sprintf("v%02d", i)] = value
		}
		return m
	}
	n := 0
	for per := lim.MaxVars - 1; per > 0; {
		_, _, err := e.f.Ops.UpsertGroup(ctx, tenantA, &nstancev1.GroupSpec{GroupId: fmt.Sprintf("a%03d", n), Template: "worker", Vars: vars(per)}, "")
		switch {
		case err == nil:
			n++
		case errors.Is(err, tenantops.ErrQuota):
			per-- // the remainder: fewer vars
		default:
			return 0, 0, err
		}
	}
	return n, e.docBytes(ctx, tenantA), nil
}

// docBytes is the size of a tenant's groups document (-1: none).
func (e *env) docBytes(ctx context.Context, tenant string) int {
	o, err := e.store.Get(ctx, layout.New("").TenantGroups(shard, tenant))
	if err != nil {
		return -1
	}
	return len(o.Body)
}

func bench(ctx context.Context, kind string, upserts, total int) error {
	cfg, err := config.Parse([]byte(shardtest.Config("bench", shard, "mock")))
	if err != nil {
		return err
	}
	if total > 0 {
		cfg.Shard.Limits.MaxTenantGroupBytes = total
		if err := cfg.Validate(); err != nil {
			return err
		}
	}
	lim := cfg.Shard.Limits.WithDefaults()
	quiet, err := open(ctx, kind, "quiet", cfg)
	if err != nil {
		return err
	}
	defer quiet.close()
	loaded, err := open(ctx, kind, "loaded", cfg)
	if err != nil {
		return err
	}
	defer loaded.close()
	nA, docLoaded, err := loaded.fill(ctx, lim)
	if err != nil {
		return err
	}
	fmt.Printf("store %s: tenant A holds %d groups (max_tenant_group_bytes %d, max_var_value_bytes %d) in a %d-byte document; tenant B's document %d bytes\n",
		kind, nA, lim.MaxTenantGroupBytes, lim.MaxVarValueBytes, docLoaded, loaded.docBytes(ctx, tenantB))
	upsert := func(e *env, i int) (time.Duration, error) {
		t0 := time.Now()
		_, _, err := e.f.Ops.UpsertGroup(ctx, tenantB, &nstancev1.GroupSpec{GroupId: "b0", Template: "worker",
			Vars: map[string]string{"team": "b", "rev": fmt.Sprint(i)}}, "")
		return time.Since(t0), err
	}
	// Warm both (connections, page cache, SQLite) before measuring.
	for i := range 20 {
		for _, e := range []*env{quiet, loaded} {
			if _, err := upsert(e, -i); err != nil {
				return err
			}
		}
	}
	var dq, dl []time.Duration
	for i := range upserts {
		order := []*env{quiet, loaded}
		if i%2 == 1 {
			order = []*env{loaded, quiet}
		}
		for _, e := range order {
			d, err := upsert(e, i)
			if err != nil {
				return fmt.Errorf("%s upsert %d: %w", e.name, i, err)
			}
			if e == quiet {
				dq = append(dq, d)
			} else {
				dl = append(dl, d)
			}
		}
	}
	mq, ml := quantile(dq, 0.5), quantile(dl, 0.5)
	fmt.Printf("store %s: tenant B UpsertGroup, %d calls each: A empty median %s (p90 %s), A at its limits median %s (p90 %s); ratio %.2f\n",
		kind, upserts, ms(mq), ms(quantile(dq, 0.9)), ms(ml), ms(quantile(dl, 0.9)), float64(ml)/float64(mq))
	return nil
}

func quantile(ds []time.Duration, q float64) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[int(q*float64(len(s)-1))]
}

func ms(d time.Duration) string { return fmt.Sprintf("%.2f ms", float64(d.Microseconds())/1000) }
