// Command takeover measures how long a new shard leader takes before it
// serves its state, with N instance records (1,000 groups of N/1,000) in
// object storage: starting from the SQLite cache against listing storage and
// reading every record, side by side in one run, on a directory store and on
// dev-s3 over the AWS SDK (the production path: ListObjectsV2 + N GETs), each
// with 0 and with M used nonce markers in the bucket (issue 22: takeover
// must not grow with history).
//
//	go run ./bench/takeover -instances 10000 -markers 0,100000 -runs 3
//
// A term is the real reconciler of internal/server/fleet with the mock
// provider (which already runs every instance, so the term finds nothing to
// do). "served" is the time from Run until the Operator reads (ListInstances)
// answer with all N instances; "verified" until the state was checked
// against storage and the reconciler may act. Without the cache the two are
// the same: the term reads every record before it serves.
package main

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/nstance-dev/nstance/internal/config"
	"github.com/nstance-dev/nstance/internal/devs3/devs3test"
	"github.com/nstance-dev/nstance/internal/layout"
	"github.com/nstance-dev/nstance/internal/server/app"
	"github.com/nstance-dev/nstance/internal/server/cache"
	"github.com/nstance-dev/nstance/internal/server/groups"
	"github.com/nstance-dev/nstance/internal/server/instances"
	"github.com/nstance-dev/nstance/internal/server/provider/mock"
	"github.com/nstance-dev/nstance/internal/server/reconcile"
	"github.com/nstance-dev/nstance/internal/server/shardtest"
	"github.com/nstance-dev/nstance/pkg/objstore"
	"github.com/nstance-dev/nstance/pkg/objstore/dirstore"
)

const (
	tenant = "bench"
	shard  = "bench-1"
)

func main() {
	n := flag.Int("instances", 10000, "instance records (a multiple of 1,000: 1,000 groups)")
	markerList := flag.String("markers", "0,100000", "used nonce marker counts to measure (one bucket each)")
	runs := flag.Int("runs", 3, "takeovers per case (the median is reported)")
	storeList := flag.String("stores", "dir,s3", "dir (directory store) and/or s3 (in-process dev-s3 over the AWS SDK)")
	modeList := flag.String("modes", "storage,cache", "how a term starts: storage (list + GETs) and/or cache")
	flag.Parse()
	var modes []bool
	for _, m := range strings.Split(*modeList, ",") {
		switch strings.TrimSpace(m) {
		case "storage":
			modes = append(modes, false)
		case "cache":
			modes = append(modes, true)
		default:
			fmt.Fprintf(os.Stderr, "takeover bench: -modes: %q is neither storage nor cache\n", m)
			os.Exit(2)
		}
	}
	var markers []int
	for _, f := range strings.Split(*markerList, ",") {
		m, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || m < 0 {
			fmt.Fprintf(os.Stderr, "takeover bench: -markers: %q is not a count\n", f)
			os.Exit(2)
		}
		markers = append(markers, m)
	}
	if *n <= 0 || *n%1000 != 0 || *runs <= 0 {
		fmt.Fprintln(os.Stderr, "takeover bench: -instances must be a positive multiple of 1000 and -runs positive")
		os.Exit(2)
	}
	for _, kind := range strings.Split(*storeList, ",") {
		if err := bench(kind, *n, markers, *runs, modes); err != nil {
			fmt.Fprintln(os.Stderr, "takeover bench:", err)
			os.Exit(1)
		}
	}
}

type env struct {
	kind    string
	dir     string         // the bucket's directory
	seed    objstore.Store // writes straight to the directory
	store   objstore.Store // what the term reads through
	stop    func()
	cfg     *config.Config
	prov    *mock.Provider
	cacheDB *cache.Cache
	minter  reconcile.KeyMinter
}

func open(ctx context.Context, kind string) (*env, error) {
	dir, err := os.MkdirTemp("", "bench-takeover-")
	if err != nil {
		return nil, err
	}
	bucket := filepath.Join(dir, "bucket")
	if err := os.MkdirAll(bucket, 0o755); err != nil {
		return nil, err
	}
	seed, err := dirstore.Open(bucket)
	if err != nil {
		return nil, err
	}
	_, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, err
	}
	e := &env{kind: kind, dir: dir, seed: seed, prov: mock.New(), stop: func() {},
		minter: reconcile.KeyMinter{Key: key, ClusterID: "bench", Shard: shard, TTL: 15 * time.Minute}}
	switch kind {
	case "dir":
		e.store = seed
	case "s3":
		if e.store, e.stop, err = devs3test.Serve(ctx, bucket, 64); err != nil {
			return nil, err
		}
	default:
		return nil, fmt.Errorf("unknown store %q (want dir or s3)", kind)
	}
	// No create rate limit: populating is set-up, not what is measured.
	text := strings.Replace(shardtest.Config("bench", shard, "mock"), `"default_drain_timeout": "30s",`,
		`"default_drain_timeout": "30s", "limits": {"tenant_create_rate": {"per_minute": 1048576, "burst": 1048576}, "max_groups_per_tenant": 100000},`, 1)
	if e.cfg, err = config.Parse([]byte(text)); err != nil {
		return nil, err
	}
	if e.cacheDB, err = cache.Open(ctx, filepath.Join(dir, "cache", "db", shard+".sqlite")); err != nil {
		return nil, err
	}
	return e, nil
}

func (e *env) close() {
	_ = e.cacheDB.Close()
	e.stop()
	_ = os.RemoveAll(e.dir)
}

func (e *env) fleet(store objstore.Store, cached bool) (*app.Assembly, error) {
	p := app.Parts{Config: e.cfg, ConfigETag: "e1", Store: store, Keys: layout.New(""), Provider: e.prov,
		NonceKey: e.minter.Key, Tuning: app.Tuning{ResyncInterval: time.Hour}}
	if cached {
		// Each term starts from the cache (app.Assemble mirrors into it).
		p.Cache = e.cacheDB
	}
	return app.Assemble(p)
}

// populate creates 1,000 groups of n/1,000 and lets a term converge them
// (writing straight to the directory), so every later term finds its
// records and the provider's instances in agreement.
func (e *env) populate(ctx context.Context, n int) error {
	f, err := e.fleet(e.seed, false)
	if err != nil {
		return err
	}
	if _, err := f.Groups.Load(ctx); err != nil {
		return err
	}
	for g := range 1000 {
		if _, _, err := f.Groups.Upsert(ctx, groups.Key{Tenant: tenant, ID: fmt.Sprintf("g%04d", g)}, groups.Spec{Template: "worker", Size: n / 1000}, ""); err != nil {
			return err
		}
	}
	cctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- f.Lead(cctx) }()
	deadline := time.Now().Add(10 * time.Minute)
	for {
		if f.Instances.Len() == n && len(f.Instances.List(func(r *instances.Record) bool { return r.State != instances.StateRunning })) == 0 {
			break
		}
		if time.Now().After(deadline) {
			cancel()
			<-done
			return fmt.Errorf("populating: %d of %d instances running after 10 minutes", f.Instances.Len(), n)
		}
		time.Sleep(20 * time.Millisecond)
	}
	cancel()
	return <-done
}

// addMarkers writes used agent-nonce markers have..total-1 as plain files
// (dev-s3 and the directory store serve plain files), as registrations would
// have left them.
func (e *env) addMarkers(have, total int) error {
	dir := filepath.Join(e.dir, "bucket", "shard", shard, "nonces")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	now := time.Now().UTC()
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := have + w; i < total; i += 8 {
				jti := fmt.Sprintf("bench-%08d", i)
				body := fmt.Sprintf(`{"jti":%q,"kind":"agent","sub":"g0000-%08x","tenant":%q,"used_at":%q,"expires_at":%q,"used_by":"srv-1"}`,
					jti, i, tenant, now.Format(time.RFC3339), now.Add(15*time.Minute).Format(time.RFC3339))
				if err := os.WriteFile(filepath.Join(dir, jti), []byte(body), 0o644); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	return <-errs
}

type sample struct{ served, verified time.Duration }

// term runs one leadership term until it verified its state, then ends it.
func (e *env) term(ctx context.Context, n int, cached bool) (sample, error) {
	f, err := e.fleet(e.store, cached)
	if err != nil {
		return sample{}, err
	}
	runtime.GC()
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	began := time.Now()
	go func() { done <- f.Lead(cctx) }()
	for !f.Reconciler.Running() {
		time.Sleep(50 * time.Microsecond)
	}
	if err := f.Reconciler.AwaitLoaded(ctx); err != nil {
		return sample{}, err
	}
	if got := len(f.Ops.ListInstances(tenant, nil, nil, false)); got != n {
		return sample{}, fmt.Errorf("the term served %d instances, want %d", got, n)
	}
	s := sample{served: time.Since(began)}
	for !f.Reconciler.Verified() {
		select {
		case err := <-done:
			return sample{}, fmt.Errorf("term ended before verifying: %v", err)
		case <-time.After(200 * time.Microsecond):
		}
	}
	s.verified = time.Since(began)
	cancel()
	if err := <-done; err != nil {
		return sample{}, err
	}
	return s, nil
}

// bench measures one store kind: one bucket per marker count, each
// populated the same way (its own provider and cache), and the takeovers of
// all buckets and both start modes interleaved run by run, so a load change
// on the machine hits every case alike.
func bench(kind string, n int, markers []int, runs int, modes []bool) error {
	ctx := context.Background()
	envs := make([]*env, 0, len(markers))
	defer func() {
		for _, e := range envs {
			e.close()
		}
	}()
	for i, m := range markers {
		e, err := open(ctx, kind)
		if err != nil {
			return err
		}
		envs = append(envs, e)
		t0 := time.Now()
		if err := e.populate(ctx, n); err != nil {
			return err
		}
		if err := e.addMarkers(0, m); err != nil {
			return err
		}
		fmt.Printf("# store=%s: bucket %d: %d instances in 1,000 groups and %d nonce markers written in %s\n", kind, i, n, m, time.Since(t0).Round(time.Millisecond))
		// The cache as a standby has it: filled at its start.
		if _, err := e.cacheDB.Rebuild(ctx, e.store, []cache.Source{
			{Kind: cache.KindInstance, Prefix: layout.New("").InstancePrefix(shard)}, {Kind: cache.KindGroups, Key: layout.New("").Groups(shard)},
			{Kind: cache.KindTenantGroups, Prefix: layout.New("").TenantGroupsPrefix(shard)},
		}, time.Now()); err != nil {
			return err
		}
		// The cache's etags must be the listing's, or a warm start reads everything.
		st := instances.NewStore(e.store, layout.New(""), shard, instances.CacheMirror{Cache: e.cacheDB})
		if _, _, err := st.LoadCached(ctx); err != nil {
			return err
		}
		sr, err := st.Sync(ctx)
		if err != nil {
			return err
		}
		fmt.Printf("# store=%s: bucket %d: a warm check against storage listed %d records and read %d\n", kind, i, sr.Listed, sr.Fetched)
	}
	// Flush what populating wrote, and take one unmeasured term per bucket
	// and mode, so the first measured term does not pay for write-back.
	syscall.Sync()
	for _, e := range envs {
		for _, cached := range modes {
			if _, err := e.term(ctx, n, cached); err != nil {
				return fmt.Errorf("warm-up term: %w", err)
			}
		}
	}
	type counts struct{ c, d int }
	before := make([]counts, len(envs))
	for i, e := range envs {
		before[i].c, before[i].d = e.prov.Counts()
	}
	res := map[[2]int][]sample{} // (bucket, cached) -> samples
	for r := range runs {
		// Alternate the bucket order too: no case always follows another.
		idx := make([]int, len(envs))
		for i := range idx {
			idx[i] = i
		}
		if r%2 == 1 {
			slices.Reverse(idx)
		}
		for _, i := range idx {
			e := envs[i]
			// Alternate the order so neither mode always runs on a warmer page cache.
			order := slices.Clone(modes)
			if (r+i)%2 == 1 {
				slices.Reverse(order)
			}
			for _, cached := range order {
				s, err := e.term(ctx, n, cached)
				if err != nil {
					return fmt.Errorf("store %s, markers %d, cached %v: %w", kind, markers[i], cached, err)
				}
				res[[2]int{i, b2i(cached)}] = append(res[[2]int{i, b2i(cached)}], s)
			}
		}
	}
	fmt.Printf("| store | nonce markers | start from | served (runs) | served median | verified median |\n|---|---|---|---|---|---|\n")
	for i, m := range markers {
		for _, cached := range modes {
			from := "storage (list + GETs)"
			if cached {
				from = "SQLite cache"
			}
			var served, verified []time.Duration
			var each []string
			for _, s := range res[[2]int{i, b2i(cached)}] {
				served, verified = append(served, s.served), append(verified, s.verified)
				each = append(each, ms(s.served))
			}
			fmt.Printf("| %s | %d | %s | %s | **%s** | %s |\n", kind, m, from, strings.Join(each, ", "), ms(median(served)), ms(median(verified)))
		}
	}
	for i, e := range envs {
		if c, d := e.prov.Counts(); c != before[i].c || d != before[i].d {
			return fmt.Errorf("the measured terms created %d and deleted %d instances; they should have found nothing to do", c-before[i].c, d-before[i].d)
		}
	}
	return nil
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}

func ms(d time.Duration) string { return fmt.Sprintf("%.0f ms", float64(d.Microseconds())/1000) }
