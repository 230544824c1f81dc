// Command devk8scrd measures what CRD schemas (validation, CEL rules,
// defaulting, pruning) add to dev-k8s's create latency for the project's
// custom resources: two in-process dev-k8s servers, one serving the CRDs
// with their schemas and one ignoring them, take the same sequential
// creates in alternating slices (so both see the same background load).
// Results go to bench/RESULTS.md.
package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime/pprof"
	"sort"
	"time"

	"github.com/go-logr/logr"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	infrav1 "github.com/nstance-dev/nstance/api/v1beta1"

	"github.com/nstance-dev/nstance/internal/devk8s/apiserver"
	"github.com/nstance-dev/nstance/internal/testing/kubetest"
)

func main() {
	creates := flag.Int("creates", 1500, "creates per server per run")
	runs := flag.Int("runs", 5, "runs")
	slice := flag.Int("slice", 1, "creates per server before switching")
	cpuProfile := flag.String("cpuprofile", "", "write a CPU profile of the whole run here")
	flag.Parse()
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err == nil {
			_ = pprof.StartCPUProfile(f)
		}
	}
	err := run(*creates, *runs, *slice)
	pprof.StopCPUProfile() // a no-op without -cpuprofile
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench devk8scrd:", err)
		os.Exit(1)
	}
}

type target struct {
	name  string
	url   string
	token string
	hc    *http.Client
	lat   []time.Duration
	// cl is a controller-runtime client with the project's types, as
	// nstance-operator creates NstanceMachines; typed its latencies.
	cl    client.Client
	typed []time.Duration
}

func start(ctx context.Context, name, dir string, crds []string, ignore bool) (*target, func(), error) {
	s, err := apiserver.New(ctx, logr.Discard(), apiserver.Options{Dir: dir, CRDFiles: crds, IgnoreCRDSchemas: ignore})
	if err != nil {
		return nil, nil, fmt.Errorf("start %s: %w", name, err)
	}
	hs := httptest.NewServer(s)
	stop := func() {
		hs.Close()
		_ = s.Close()
	}
	scheme, err := kubetest.NewScheme()
	if err != nil {
		stop()
		return nil, nil, err
	}
	cl, err := client.New(&rest.Config{Host: hs.URL, BearerToken: s.AdminToken(), ContentConfig: rest.ContentConfig{ContentType: "application/json"}, QPS: -1}, client.Options{Scheme: scheme})
	if err != nil {
		stop()
		return nil, nil, err
	}
	return &target{name: name, url: hs.URL, token: s.AdminToken(), hc: hs.Client(), cl: cl}, stop, nil
}

// bodies are the project's kinds, created in turn.
var bodies = []struct {
	path string
	body func(name string) string
}{
	{"/apis/infrastructure.cluster.x-k8s.io/v1beta1/namespaces/default/nstancemachines", func(n string) string {
		return `{"apiVersion":"infrastructure.cluster.x-k8s.io/v1beta1","kind":"NstanceMachine","metadata":{"name":"` + n +
			`","labels":{"cluster.x-k8s.io/cluster-name":"dev"}},"spec":{"group":"workers","shard":"dev-1","instanceType":"t3.small","subnetPool":"private","vars":{"a":"1","b":"2"}}}`
	}},
	{"/apis/infrastructure.cluster.x-k8s.io/v1beta1/namespaces/default/nstancemachinetemplates", func(n string) string {
		return `{"apiVersion":"infrastructure.cluster.x-k8s.io/v1beta1","kind":"NstanceMachineTemplate","metadata":{"name":"` + n +
			`"},"spec":{"template":{"spec":{"group":"workers","instanceType":"t3.small"}}}}`
	}},
	{"/apis/infrastructure.cluster.x-k8s.io/v1beta1/namespaces/default/nstanceshardgroups", func(n string) string {
		return `{"apiVersion":"infrastructure.cluster.x-k8s.io/v1beta1","kind":"NstanceShardGroup","metadata":{"name":"` + n +
			`"},"spec":{"group":"workers","shard":"dev-1","size":3}}`
	}},
}

func (tg *target) create(seq int) error {
	b := bodies[seq%len(bodies)]
	req, err := http.NewRequest(http.MethodPost, tg.url+b.path, bytes.NewBufferString(b.body(fmt.Sprintf("obj-%d", seq))))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+tg.token)
	start := time.Now()
	res, err := tg.hc.Do(req)
	if err != nil {
		return err
	}
	data, _ := io.ReadAll(res.Body)
	_ = res.Body.Close()
	elapsed := time.Since(start)
	if res.StatusCode != http.StatusCreated {
		return fmt.Errorf("%s: create: %d %s", tg.name, res.StatusCode, data)
	}
	tg.lat = append(tg.lat, elapsed)
	return nil
}

func (tg *target) createTyped(ctx context.Context, seq int) error {
	m := &infrav1.NstanceMachine{
		ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("typed-%d", seq), Namespace: "default", Labels: map[string]string{"cluster.x-k8s.io/cluster-name": "dev"}},
		Spec:       infrav1.NstanceMachineSpec{Group: "workers", Shard: "dev-1", InstanceType: "t3.small", SubnetPool: "private"},
	}
	start := time.Now()
	if err := tg.cl.Create(ctx, m); err != nil {
		return fmt.Errorf("%s: typed create: %w", tg.name, err)
	}
	tg.typed = append(tg.typed, time.Since(start))
	return nil
}

func median(ds []time.Duration) time.Duration {
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[len(s)/2]
}

func run(creates, runs, slice int) error {
	root, err := kubetest.RepoRoot()
	if err != nil {
		return err
	}
	crds, err := filepath.Glob(filepath.Join(root, "config", "crd", "bases", "*.yaml"))
	if err != nil || len(crds) == 0 {
		return fmt.Errorf("project CRDs not found: %v", err)
	}
	tmp, err := os.MkdirTemp("", "bench-devk8scrd-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	with, stopWith, err := start(ctx, "schemas", filepath.Join(tmp, "with"), crds, false)
	if err != nil {
		return err
	}
	defer stopWith()
	without, stopWithout, err := start(ctx, "no schemas", filepath.Join(tmp, "without"), crds, true)
	if err != nil {
		return err
	}
	defer stopWithout()
	seq := 0
	// Warm-up: connections, CEL programs, field managers.
	for i := 0; i < 60; i++ {
		for _, tg := range []*target{with, without} {
			if err := tg.create(seq); err != nil {
				return err
			}
		}
		seq++
	}
	fmt.Println("| run | HTTP median with schemas | without | ratio | client-go median with schemas | without | ratio |")
	fmt.Println("|---|---|---|---|---|---|---|")
	var ratios, typedRatios []float64
	for r := 1; r <= runs; r++ {
		for _, tg := range []*target{with, without} {
			tg.lat, tg.typed = nil, nil
		}
		for done := 0; done < creates; done += slice {
			for _, tg := range []*target{with, without} {
				for i := 0; i < slice; i++ {
					if err := tg.create(seq + i); err != nil {
						return err
					}
					if i%3 == 0 {
						if err := tg.createTyped(ctx, seq+i); err != nil {
							return err
						}
					}
				}
			}
			seq += slice
		}
		mw, mo := median(with.lat), median(without.lat)
		tw, to := median(with.typed), median(without.typed)
		ratios = append(ratios, float64(mw)/float64(mo))
		typedRatios = append(typedRatios, float64(tw)/float64(to))
		fmt.Printf("| %d | %v | %v | %.2f | %v | %v | %.2f |\n", r, mw.Round(time.Microsecond), mo.Round(time.Microsecond), ratios[len(ratios)-1],
			tw.Round(time.Microsecond), to.Round(time.Microsecond), typedRatios[len(typedRatios)-1])
	}
	sort.Float64s(ratios)
	sort.Float64s(typedRatios)
	fmt.Printf("\nmedian ratio over %d runs: HTTP %.3f, client-go %.3f\n", runs, ratios[len(ratios)/2], typedRatios[len(typedRatios)/2])
	return nil
}
