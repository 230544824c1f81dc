// Command devnodes measures the dev stack's nodes (make dev-tmux-k8s or
// make dev-tmux-apiserver, running): for every instance in the dev bucket's
// records, the time from its creation to its Node becoming Ready with the
// instance's provider ID, and the resident memory of every
// nstance-hollow-kubelet process running from the stack's agent
// directories. It only reads: records from the dev-s3 directory, Nodes
// through the kubeconfig, /proc through prometheus/procfs.
//
//	go run ./bench/devnodes -dir temp -kubeconfig temp/operator/kubeconfig
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/prometheus/procfs"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

type record struct {
	ID         string    `json:"id"`
	ProviderID string    `json:"provider_id"`
	State      string    `json:"state"`
	CreatedAt  time.Time `json:"created_at"`
}

func main() {
	dir := flag.String("dir", "temp", "the dev stack's directory (records under dev-s3/shard/*/instances)")
	kubeconfig := flag.String("kubeconfig", "temp/operator/kubeconfig", "admin kubeconfig of the dev cluster")
	flag.Parse()
	if err := run(*dir, *kubeconfig); err != nil {
		fmt.Fprintln(os.Stderr, "devnodes:", err)
		os.Exit(1)
	}
}

func run(dir, kubeconfig string) error {
	files, err := filepath.Glob(filepath.Join(dir, "dev-s3", "shard", "*", "instances", "*.json"))
	if err != nil {
		return err
	}
	recs := map[string]record{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return err
		}
		var r record
		if err := json.Unmarshal(b, &r); err != nil {
			return fmt.Errorf("%s: %w", f, err)
		}
		if r.State == "running" || r.State == "creating" {
			recs[r.ProviderID] = r
		}
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return err
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	nodes, err := cs.CoreV1().Nodes().List(context.Background(), metav1.ListOptions{})
	if err != nil {
		return err
	}
	var joins []time.Duration
	for _, n := range nodes.Items {
		r, ok := recs[n.Spec.ProviderID]
		if !ok {
			fmt.Printf("node %-28s providerID %s: no running instance\n", n.Name, n.Spec.ProviderID)
			continue
		}
		for _, c := range n.Status.Conditions {
			if c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue {
				d := c.LastTransitionTime.Sub(r.CreatedAt)
				joins = append(joins, d)
				fmt.Printf("node %-28s kubelet %s  instance created -> Node Ready %s\n", n.Name, n.Status.NodeInfo.KubeletVersion, d.Round(10*time.Millisecond))
			}
		}
	}
	fmt.Printf("instances running: %d, Ready Nodes with their provider ID: %d\n", len(recs), len(joins))
	if len(joins) > 0 {
		slices.Sort(joins)
		fmt.Printf("created -> Ready: median %s, max %s (Ready times are the API server's, second resolution)\n",
			joins[len(joins)/2].Round(10*time.Millisecond), joins[len(joins)-1].Round(10*time.Millisecond))
	}
	return rss(dir)
}

// rss prints the resident memory of the hollow kubelets running from dir's
// agent directories.
func rss(dir string) error {
	abs, err := filepath.Abs(filepath.Join(dir, "agents"))
	if err != nil {
		return err
	}
	procs, err := procfs.AllProcs()
	if err != nil {
		return err
	}
	var mbs []float64
	for _, p := range procs {
		exe, err := p.Executable()
		if err != nil || filepath.Base(exe) != "nstance-hollow-kubelet" {
			continue
		}
		cwd, err := p.Cwd()
		if err != nil || !strings.HasPrefix(cwd, abs+string(os.PathSeparator)) {
			continue
		}
		st, err := p.Stat()
		if err != nil {
			continue
		}
		mbs = append(mbs, float64(st.ResidentMemory())/1e6)
	}
	sort.Float64s(mbs)
	if len(mbs) == 0 {
		fmt.Println("no nstance-hollow-kubelet runs from", abs)
		return nil
	}
	fmt.Printf("hollow kubelets: %d, RSS median %.1f MB, max %.1f MB\n", len(mbs), mbs[len(mbs)/2], mbs[len(mbs)-1])
	return nil
}
