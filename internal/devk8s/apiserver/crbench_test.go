package apiserver

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"

	"github.com/go-logr/logr"
)

// BenchmarkCustomResourceCreate measures one NstanceMachine create through
// the handler with and without the CRD's schema (no network).
func BenchmarkCustomResourceCreate(b *testing.B) {
	crd := filepath.Join("..", "..", "..", "config", "crd", "bases", "infrastructure.cluster.x-k8s.io_nstancemachines.yaml")
	for _, ignore := range []bool{false, true} {
		b.Run(fmt.Sprintf("ignoreSchemas=%v", ignore), func(b *testing.B) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			s, err := New(ctx, logr.Discard(), Options{Dir: b.TempDir(), CRDFiles: []string{crd}, IgnoreCRDSchemas: ignore})
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			i := 0
			for b.Loop() {
				i++
				body := `{"apiVersion":"infrastructure.cluster.x-k8s.io/v1beta1","kind":"NstanceMachine","metadata":{"name":"m` + fmt.Sprint(i) +
					`","labels":{"cluster.x-k8s.io/cluster-name":"dev"}},"spec":{"group":"workers","shard":"dev-1","instanceType":"t3.small","vars":{"a":"1"}}}`
				req := httptest.NewRequest(http.MethodPost, "/apis/infrastructure.cluster.x-k8s.io/v1beta1/namespaces/default/nstancemachines?fieldManager=bench", strings.NewReader(body))
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set("Authorization", "Bearer "+s.AdminToken())
				w := httptest.NewRecorder()
				s.ServeHTTP(w, req)
				if w.Code != http.StatusCreated {
					b.Fatalf("%d %s", w.Code, w.Body)
				}
			}
		})
	}
}
