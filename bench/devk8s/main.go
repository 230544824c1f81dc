// Command devk8s measures dev-k8s next to envtest's kube-apiserver: creates
// per second, LIST of many ConfigMaps, and the latency from a hand edit of a
// JSON file to the matching watch event. Results go to bench/RESULTS.md.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"runtime/pprof"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/nstance-dev/nstance/internal/devk8s/app"
	"github.com/nstance-dev/nstance/internal/testing/kubetest"
)

func main() {
	objects := flag.Int("objects", 5000, "ConfigMaps to create and list")
	runs := flag.Int("runs", 10, "LIST repetitions per server")
	edits := flag.Int("edits", 200, "hand edits for the watch latency")
	workers := flag.Int("workers", 8, "concurrent creators")
	cpuProfile := flag.String("cpuprofile", "", "write a CPU profile of the whole run here")
	flag.Parse()
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err == nil {
			_ = pprof.StartCPUProfile(f)
		}
	}
	err := run(*objects, *runs, *edits, *workers)
	pprof.StopCPUProfile() // a no-op without -cpuprofile
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench devk8s:", err)
		os.Exit(1)
	}
}

type target struct {
	name string
	cfg  *rest.Config
	cs   *kubernetes.Clientset
	hc   *http.Client
}

func newTarget(name string, cfg *rest.Config) (*target, error) {
	c := rest.CopyConfig(cfg)
	c.ContentType = "application/json"
	c.AcceptContentTypes = "application/json"
	c.QPS, c.Burst = -1, 0
	cs, err := kubernetes.NewForConfig(c)
	if err != nil {
		return nil, err
	}
	hc, err := rest.HTTPClientFor(c)
	if err != nil {
		return nil, err
	}
	return &target{name: name, cfg: c, cs: cs, hc: hc}, nil
}

func run(objects, runs, edits, workers int) error {
	ctx := context.Background()
	env, stop, err := kubetest.StartEnv()
	if err != nil {
		return err
	}
	defer func() { _ = stop() }()
	dir, err := os.MkdirTemp("", "bench-devk8s-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	dctx, cancel := context.WithCancel(ctx)
	dev, err := app.Start(dctx, logr.Discard(), app.Config{Addr: "127.0.0.1:0", Dir: dir})
	if err != nil {
		cancel()
		return err
	}
	defer func() { cancel(); _ = dev.Wait() }()

	et, err := newTarget("envtest", env.Config)
	if err != nil {
		return err
	}
	dt, err := newTarget("dev-k8s", &rest.Config{Host: dev.URL, BearerToken: dev.AdminToken})
	if err != nil {
		return err
	}
	rates := map[string]float64{}
	for _, tg := range []*target{dt, et} {
		if _, err := tg.cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "bench"}}, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("%s: create namespace: %w", tg.name, err)
		}
		rate, err := createMany(ctx, tg, objects, workers)
		if err != nil {
			return err
		}
		rates[tg.name] = rate
	}
	fmt.Printf("creates/s (%d ConfigMaps, %d workers): dev-k8s %.0f, envtest %.0f\n", objects, workers, rates["dev-k8s"], rates["envtest"])

	listTimes := map[string][]time.Duration{}
	for i := 0; i < runs; i++ {
		for _, tg := range []*target{dt, et} {
			d, n, err := listOnce(ctx, tg)
			if err != nil {
				return err
			}
			if n < int64(objects) {
				return fmt.Errorf("%s: listed %d bytes only", tg.name, n)
			}
			listTimes[tg.name] = append(listTimes[tg.name], d)
		}
	}
	dm, em := median(listTimes["dev-k8s"]), median(listTimes["envtest"])
	fmt.Printf("LIST %d ConfigMaps, median of %d: dev-k8s %v, envtest %v, ratio %.2f\n", objects, runs, dm.Round(time.Microsecond), em.Round(time.Microsecond), float64(dm)/float64(em))

	lat, err := editLatency(ctx, dt, filepath.Join(dir, "configmaps", "bench"), edits)
	if err != nil {
		return err
	}
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	fmt.Printf("file edit -> watch event over %d edits: p50 %v, p99 %v, max %v\n", len(lat),
		pct(lat, 50).Round(10*time.Microsecond), pct(lat, 99).Round(10*time.Microsecond), lat[len(lat)-1].Round(10*time.Microsecond))
	return nil
}

func createMany(ctx context.Context, tg *target, n, workers int) (float64, error) {
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	start := time.Now()
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := next.Add(1)
				if i > int64(n) {
					return
				}
				cm := &corev1.ConfigMap{
					ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("cm-%05d", i), Labels: map[string]string{"bench": "yes"}},
					Data:       map[string]string{"key": "value", "index": fmt.Sprint(i)},
				}
				if _, err := tg.cs.CoreV1().ConfigMaps("bench").Create(ctx, cm, metav1.CreateOptions{}); err != nil {
					errs <- fmt.Errorf("%s: create: %w", tg.name, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return 0, err
	}
	return float64(n) / time.Since(start).Seconds(), nil
}

// listOnce fetches the whole list as JSON and reads the body to the end.
func listOnce(ctx context.Context, tg *target) (time.Duration, int64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimRight(tg.cfg.Host, "/")+"/api/v1/namespaces/bench/configmaps", nil)
	if err != nil {
		return 0, 0, err
	}
	req.Header.Set("Accept", "application/json")
	start := time.Now()
	res, err := tg.hc.Do(req)
	if err != nil {
		return 0, 0, err
	}
	n, err := io.Copy(io.Discard, res.Body)
	_ = res.Body.Close()
	d := time.Since(start)
	if err != nil || res.StatusCode != http.StatusOK {
		return 0, 0, fmt.Errorf("%s: list: %d %v", tg.name, res.StatusCode, err)
	}
	return d, n, nil
}

// editLatency rewrites one ConfigMap's file by hand and times the arrival
// of each MODIFIED event.
func editLatency(ctx context.Context, tg *target, nsDir string, edits int) ([]time.Duration, error) {
	cms := tg.cs.CoreV1().ConfigMaps("bench")
	if _, err := cms.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "edited"}}, metav1.CreateOptions{}); err != nil {
		return nil, err
	}
	list, err := cms.List(ctx, metav1.ListOptions{FieldSelector: "metadata.name=edited"})
	if err != nil {
		return nil, err
	}
	w, err := cms.Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=edited", ResourceVersion: list.ResourceVersion})
	if err != nil {
		return nil, err
	}
	defer w.Stop()
	path := filepath.Join(nsDir, "edited.json")
	var out []time.Duration
	for i := 0; i < edits; i++ {
		body := fmt.Sprintf(`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"edited","namespace":"bench"},"data":{"n":"%d"}}`, i)
		start := time.Now()
		if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
			return nil, err
		}
		for {
			select {
			case ev, ok := <-w.ResultChan():
				if !ok {
					return nil, fmt.Errorf("watch closed")
				}
				cm, isCM := ev.Object.(*corev1.ConfigMap)
				if ev.Type != watch.Modified || !isCM || cm.Data["n"] != fmt.Sprint(i) {
					continue
				}
				out = append(out, time.Since(start))
			case <-time.After(5 * time.Second):
				return nil, fmt.Errorf("no event for edit %d", i)
			}
			break
		}
	}
	return out, nil
}

func median(ds []time.Duration) time.Duration {
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[len(s)/2]
}

func pct(sorted []time.Duration, p int) time.Duration {
	i := (len(sorted)*p + 99) / 100
	if i > 0 {
		i--
	}
	return sorted[i]
}
