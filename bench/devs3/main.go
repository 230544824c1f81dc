// Command devs3 measures dev-s3 throughput: 1 KiB PUT+GET pairs per second
// through the AWS SDK with several concurrent clients, against dev-s3 and,
// in the same run, against a bare net/http handler that only writes and
// reads the file. It prints both rates and their ratio.
//
//	go run ./bench/devs3 -duration 5s -runs 3
package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime/pprof"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/go-logr/logr"

	"github.com/nstance-dev/nstance/internal/devs3"
	"github.com/nstance-dev/nstance/internal/devs3/devs3test"
)

func main() {
	duration := flag.Duration("duration", 5*time.Second, "length of each measured loop")
	runs := flag.Int("runs", 3, "number of runs; the median is reported")
	workers := flag.Int("concurrency", 8, "concurrent clients")
	size := flag.Int("size", 1024, "object size in bytes")
	cpuprofile := flag.String("cpuprofile", "", "write a CPU profile of the dev-s3 loops to this file")
	flag.Parse()
	if err := run(*duration, *runs, *workers, *size, *cpuprofile); err != nil {
		fmt.Fprintln(os.Stderr, "bench devs3:", err)
		os.Exit(1)
	}
}

func run(d time.Duration, runs, workers, size int, cpuprofile string) error {
	ctx := context.Background()
	tmp, err := os.MkdirTemp("", "bench-devs3-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	srv, err := devs3.Start(ctx, ln, devs3.Config{Bucket: "dev", Dir: filepath.Join(tmp, "devs3"), Log: logr.Discard()})
	if err != nil {
		return err
	}
	defer func() { _ = srv.Stop() }()

	bareDir := filepath.Join(tmp, "bare")
	bareLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	bare := &http.Server{Handler: bareHandler(bareDir)}
	go func() { _ = bare.Serve(bareLn) }()
	defer bare.Close()

	body := bytes.Repeat([]byte("x"), size)
	s3Client := devs3test.Client(srv.URL)
	bareClient := devs3test.Client("http://" + bareLn.Addr().String())

	var devRates, bareRates, ratios []float64
	for i := range runs {
		if cpuprofile != "" && i == 0 {
			f, err := os.Create(cpuprofile)
			if err != nil {
				return err
			}
			if err := pprof.StartCPUProfile(f); err != nil {
				return err
			}
		}
		// dev-s3 and the bare handler alternate in one-second slices so that
		// load from other processes on the machine hits both alike.
		var devPairs, barePairs, devSecs, bareSecs float64
		for left := d; left > 0; left -= time.Second {
			slice := min(left, time.Second)
			n, el, err := loop(ctx, s3Client, slice, workers, body)
			if err != nil {
				return fmt.Errorf("dev-s3 loop: %w", err)
			}
			devPairs, devSecs = devPairs+n, devSecs+el
			n, el, err = loop(ctx, bareClient, slice, workers, body)
			if err != nil {
				return fmt.Errorf("bare loop: %w", err)
			}
			barePairs, bareSecs = barePairs+n, bareSecs+el
		}
		if cpuprofile != "" && i == 0 {
			pprof.StopCPUProfile()
		}
		dr, br := devPairs/devSecs, barePairs/bareSecs
		fmt.Printf("run %d: dev-s3 %.0f pairs/s, bare handler %.0f pairs/s, ratio %.2f\n", i+1, dr, br, dr/br)
		devRates, bareRates, ratios = append(devRates, dr), append(bareRates, br), append(ratios, dr/br)
	}
	fmt.Printf("median (%d runs, %s each, %d clients, %d B): dev-s3 %.0f pairs/s, bare handler %.0f pairs/s, median ratio %.2f (goal >= 0.50)\n",
		runs, d, workers, size, median(devRates), median(bareRates), median(ratios))
	return nil
}

// loop runs PUT+GET pairs from workers goroutines for d and returns the
// pairs done and the seconds taken.
func loop(ctx context.Context, c *s3.Client, d time.Duration, workers int, body []byte) (float64, float64, error) {
	var pairs atomic.Int64
	var firstErr error
	var once sync.Once
	deadline := time.Now().Add(d)
	var wg sync.WaitGroup
	start := time.Now()
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; time.Now().Before(deadline); i++ {
				key := fmt.Sprintf("bench/w%d/k%03d", w, i%100)
				if _, err := c.PutObject(ctx, &s3.PutObjectInput{Bucket: aws.String("dev"), Key: aws.String(key), Body: bytes.NewReader(body)}); err != nil {
					once.Do(func() { firstErr = err })
					return
				}
				out, err := c.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String("dev"), Key: aws.String(key)})
				if err != nil {
					once.Do(func() { firstErr = err })
					return
				}
				got, err := io.ReadAll(out.Body)
				out.Body.Close()
				if err != nil || len(got) != len(body) {
					once.Do(func() { firstErr = fmt.Errorf("short read of %s: %d bytes, %v", key, len(got), err) })
					return
				}
				pairs.Add(1)
			}
		}()
	}
	wg.Wait()
	if firstErr != nil {
		return 0, 0, firstErr
	}
	return float64(pairs.Load()), time.Since(start).Seconds(), nil
}

// bareHandler writes PUT bodies to files and serves them on GET, nothing
// else: the floor that dev-s3 is compared with.
func bareHandler(dir string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := strings.TrimPrefix(r.URL.Path, "/dev/")
		p := filepath.Join(dir, filepath.FromSlash(key))
		switch r.Method {
		case http.MethodPut:
			data, err := io.ReadAll(r.Body)
			if err == nil {
				if err = os.MkdirAll(filepath.Dir(p), 0o755); err == nil {
					err = os.WriteFile(p, data, 0o644)
				}
			}
			if err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
			}
		case http.MethodGet:
			data, err := os.ReadFile(p)
			if err != nil {
				http.Error(w, err.Error(), http.StatusNotFound)
				return
			}
			w.Write(data)
		default:
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		}
	})
}

func median(v []float64) float64 {
	s := append([]float64{}, v...)
	sort.Float64s(s)
	return s[len(s)/2]
}
